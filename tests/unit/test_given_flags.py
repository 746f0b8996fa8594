"""What the calibrate verbs decide from the flags a user gave is the library's, reached without the
command line: `advisor calibrate` needs its proxies and pool whatever else is given, and takes the
GPU-hours' settings with a dry run only; `advisor lab calibrate --quick` keeps the settings given
beside it."""

import pytest

from capacity_advisor.advisor.calibration import sweep
from capacity_advisor.advisor.calibration.grid import CalibrateConfig
from capacity_advisor.advisor.calibration.proxies import PoolCalibrateConfig, check_given
from capacity_advisor.core.errors import InputError


def own(**changes) -> PoolCalibrateConfig:
    return PoolCalibrateConfig(**{"students": ("lab:xs",), "pool": "pool.jsonl", "out": "out", **changes})


def test_a_calibration_on_your_pool_needs_proxies_and_a_pool_and_names_the_flags_that_go_with_them():
    with pytest.raises(InputError) as e:
        check_given(own(students=()), frozenset({"dry_run", "mfu", "epochs"}), dry_run=True)
    assert str(e.value) == ("--dry-run, --mfu go with --students: calibrating on your own pool needs both --students "
                            "(your proxies) and --pool (the lab sweep is `advisor lab calibrate`)")
    with pytest.raises(InputError, match="^calibrating on your own pool needs both"):
        check_given(own(pool=None), frozenset({"dry_run"}), dry_run=True)  # --students given: no flags named


def test_the_gpu_hours_settings_go_with_a_dry_run():
    with pytest.raises(InputError, match=r"^--gpu-tflops, --decode-mfu go with --dry-run"):
        check_given(own(), frozenset({"gpu_tflops", "decode_mfu"}))
    check_given(own(), frozenset({"gpu_tflops", "decode_mfu"}), dry_run=True)
    check_given(own(), frozenset())


def test_quick_takes_the_tiny_settings_and_keeps_the_ones_given_beside_it(monkeypatch, tmp_path):
    ran = []
    monkeypatch.setattr(sweep, "run_calibration", lambda cfg, log: ran.append(cfg) or {"records": 0})
    out = str(tmp_path / "cal")
    sweep.lab_sweep(CalibrateConfig(out=out, epochs=2, n_train=99, quick=True), frozenset({"epochs", "out", "quick"}))
    assert ran[-1] == CalibrateConfig(**{**vars(CalibrateConfig.quick_settings(out)), "epochs": 2})
    sweep.lab_sweep(CalibrateConfig(out=out, epochs=2), frozenset({"epochs"}))  # without --quick: as given
    assert ran[-1] == CalibrateConfig(out=out, epochs=2)
    with pytest.raises(InputError, match="--measure-every 0 must be at least 1"):
        sweep.lab_sweep(CalibrateConfig(out=out, measure_every=0, quick=True), frozenset({"measure_every", "quick"}))
