"""experiments.transfer reads a calibration folder still running from its runs' record.json files;
each run keeps the seed its unit folder names, so two seeds of one student are two units, not one."""

import json

from capacity_advisor.advisor.predictor.labels import unit_of
from experiments.transfer import read_records


def test_a_running_calibration_folder_keeps_each_units_seed(tmp_path):
    for seed in (0, 1):
        for s in ("high", "low"):
            run = tmp_path / "units" / f"lab:smollm2-135m-s{seed}" / s
            run.mkdir(parents=True)
            (run / "record.json").write_text(json.dumps({
                "strategy": s, "model": {"spec": "lab:smollm2-135m"}, "settings": {"seed": None},
                "pool": {"task": "linear", "teacher": "scripted"},
                "evals": [{"step": 0, "epoch": 0.0, "accuracy": 0.1}]}))
    records = read_records([tmp_path])
    assert sorted(unit_of(r)["seed"] for r in records) == [0, 0, 1, 1]
    assert {(unit_of(r)["repeat"], r["strategy"]) for r in records} == {(0, "high"), (0, "low"), (1, "high"), (1, "low")}
