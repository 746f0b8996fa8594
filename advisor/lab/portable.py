"""A calibration record made portable: what ran, without where it ran.

`advisor calibrate` writes RunRecords that name their machine's folders and the time they
finished; `portable` keeps what describes the measurement (model, settings, evaluations, the
lab unit it belongs to) and moves what describes only that run into `provenance`, so the
committed records are the same wherever they were produced.
"""

from __future__ import annotations

from capacity_advisor.models.files import finite
from capacity_advisor.models.lab.ladder import LAB_TEACHER, RECIPE_VERSION


def portable(record: dict, unit, teacher: str = LAB_TEACHER, temperature: float = 1.0) -> dict:
    """A record that says what ran without saying where: no absolute paths, run-relative names."""
    r = dict(record)
    r["model"] = {k: v for k, v in r["model"].items() if k != "path"}
    r["source"] = "calibrate"
    settings = dict(r.get("settings") or {})
    provenance = dict(r.pop("provenance", None) or {})
    # records of earlier versions kept these beside the settings; they describe this run, not what it was
    for key in ("seconds", "train_tokens", "final_checkpoint"):
        if key in r:
            provenance.setdefault(key, r.pop(key))
    for key in ("resumed_from_step", "manifest"):
        if key in settings:
            provenance.setdefault(key, settings.pop(key))
    head, _, tail = str(r.get("run_id", "")).rpartition("-")
    if head and tail.isdigit():  # earlier versions appended the finishing time to the run key
        r["run_id"] = head
    settings.pop("device", None)
    settings["seed"] = unit.seed
    r["settings"] = settings
    r["provenance"] = {k: v for k, v in provenance.items() if k not in ("manifest", "final_checkpoint")}
    r["unit"] = {"task": unit.task, "score": unit.score, "size": unit.size, "seed": unit.seed, "teacher": teacher,
                 "temperature": temperature, "lab": RECIPE_VERSION, **({"build": unit.build} if unit.build else {})}
    return finite(r)  # JSON has no NaN: null instead, so any JSON reader takes the records
