"""What `advisor train` does with a manifest, decided by the library (`advisor.train`): a race asked
for, the race a recommendation planned, an export or one run; the race flags only where a race runs."""

import pytest
from helpers import make_manifest, race_manifest

from capacity_advisor.advisor.train import plan_training, train_manifest
from capacity_advisor.core.errors import InputError
from capacity_advisor.training.race import RaceRule
from capacity_advisor.training.run_manifest import RunRequest

PLANNED = {"fraction": 0.5, "wait": 0.75, "why": "the gate opened"}


@pytest.fixture
def plain(tmp_path):
    return str(race_manifest(tmp_path / "plain", "lab:xs"))


@pytest.fixture
def planned(tmp_path):
    return str(race_manifest(tmp_path / "planned", "lab:xs", race=PLANNED))


def test_a_manifest_without_a_planned_race_is_one_run(plain):
    assert plan_training(plain).action == "run"


def test_a_planned_race_runs_as_planned_without_a_stop_on_a_lead(planned):
    t = plan_training(planned)
    assert (t.action, t.planned) == ("race", True)
    assert t.rule == RaceRule(fraction=0.5, k=None, wait=0.75)


def test_a_planned_adaptive_race_stops_on_the_lead_the_plan_names(tmp_path):
    adaptive = race_manifest(tmp_path / "adaptive", "lab:xs", race={**PLANNED, "k": 1, "margin": 0.1, "patient": True})
    assert plan_training(str(adaptive)).rule == RaceRule(fraction=0.5, k=1, margin=0.1, wait=0.75, patient=True)


def test_race_patient_makes_a_race_wait_on_d_highs_lead(plain, planned):
    t = plan_training(plain, race=0.5, k=1, stops={"patient": True})
    assert t.rule == RaceRule(fraction=0.5, k=1, patient=True)
    t = plan_training(planned, stops={"k": 1, "patient": True})  # a planned race, stopped on a lead as asked
    assert t.rule == RaceRule(fraction=0.5, k=1, wait=0.75, patient=True)
    with pytest.raises(InputError, match="--race-patient sets what counts as a lead.*give --race-k N too"):
        plan_training(planned, stops={"patient": True})


def test_a_tie_check_comes_from_the_plan_or_race_tie(tmp_path, plain, planned):
    checked = race_manifest(tmp_path / "tie", "lab:xs", race={**PLANNED, "tie": 0.3})
    assert plan_training(str(checked)).rule == RaceRule(fraction=0.5, k=None, wait=0.75, tie=0.3)
    assert plan_training(planned, stops={"tie": 0.2}).rule == RaceRule(fraction=0.5, k=None, wait=0.75, tie=0.2)
    assert plan_training(plain, race=0.75, k=None, stops={"tie": 0.25}).rule == RaceRule(fraction=0.75, k=None, tie=0.25)
    with pytest.raises(InputError, match="--race-tie sets when a race stops.*runs none"):
        plan_training(plain, stops={"tie": 0.2})
    from capacity_advisor.training.manifest_checks import race_problems

    assert race_problems({**PLANNED, "tie": 0.3}) == []
    for bad in (0.5, 0.0, "x", True):
        assert any(p.startswith("race.tie:") for p in race_problems({**PLANNED, "tie": bad})), bad


def test_no_race_trains_the_recommended_set_though_a_race_is_planned(planned):
    assert plan_training(planned, no_race=True).action == "run"


def test_race_f_races_any_manifest_with_the_stops_given(plain, planned):
    for manifest in (plain, planned):
        t = plan_training(manifest, race=0.25, k=3, margin=0.1)
        assert (t.action, t.planned, t.rule) == ("race", False, RaceRule(fraction=0.25, k=3, margin=0.1))


def test_export_trains_nothing_even_where_a_race_is_planned(planned):
    assert plan_training(planned, export_dir="out").action == "export"


def test_a_race_flag_given_with_a_planned_race_stops_it_early_on_a_lead(planned):
    t = plan_training(planned, stops={"k": 3, "margin": 0.1})
    assert (t.action, t.planned, t.rule) == ("race", True, RaceRule(fraction=0.5, k=3, margin=0.1, wait=0.75))
    with pytest.raises(InputError, match="give --race-k N too"):
        plan_training(planned, stops={"margin": 0.1})


@pytest.mark.parametrize("ask, why", [
    ({"no_race": True}, "--no-race trains one set"),
    ({"export_dir": "out"}, "--export trains nothing"),
    ({}, "this manifest plans no race; --race F starts one"),
])
def test_race_stops_where_no_race_runs_are_refused_with_why(plain, ask, why):
    with pytest.raises(InputError) as e:
        plan_training(plain, stops={"k": 3}, **ask)
    assert str(e.value) == f"--race-k sets when a race stops, and this command runs none ({why}): drop it"
    with pytest.raises(InputError, match="--race-k and --race-margin set when"):
        plan_training(plain, stops={"k": 3, "margin": 0.1}, **ask)


def test_race_and_no_race_contradict(plain):
    with pytest.raises(InputError, match="contradict each other"):
        plan_training(plain, race=0.5, no_race=True)


def test_a_race_does_not_combine_with_export(plain, tmp_path):
    with pytest.raises(InputError, match="does not combine with --export"):
        train_manifest(RunRequest(plain, str(tmp_path / "run")), race=0.5, export_dir=str(tmp_path / "x"))


def test_a_dry_run_of_each_says_what_it_would_do(plain, planned, tmp_path):
    said = []
    race = train_manifest(RunRequest(planned, str(tmp_path / "race")), dry_run=True, say=said.append)
    assert race.summary["planned"] is True and race.summary["race"]["fraction"] == 0.5 and race.title is None
    assert said == [f"race of D_high against D_low in {tmp_path / 'race'}: stop at 50% of the budget (up to 75% while "
                    "D_low is behind and gaining); both runs also evaluated at 50%, 75% of the budget, so it stops "
                    "there; planned by the recommendation (--no-race trains the recommended set alone)"]
    assert race.summary["evaluated_at"] == [0.5, 0.75]
    exported = train_manifest(RunRequest(plain, ""), export_dir=str(tmp_path / "exp"), dry_run=True)
    assert exported.message.startswith(f"export checked; it would write {len(exported.summary['would_write'])} files")
    assert not (tmp_path / "exp").exists()
    said.clear()
    run = train_manifest(RunRequest(str(make_manifest(tmp_path / "one", "lab:xs")), str(tmp_path / "run")),
                         dry_run=True, say=said.append)
    assert run.summary == {"dry_run": True, "out": str(tmp_path / "run"), "would_run": said} and said


def test_a_run_needs_out(plain):
    with pytest.raises(InputError, match="--out is required"):
        train_manifest(RunRequest(plain, ""), no_race=True)


def test_a_hold_comes_from_the_plan_or_race_hold(tmp_path, plain, planned):
    held = race_manifest(tmp_path / "hold", "lab:xs", race={**PLANNED, "hold": 1.0})
    assert plan_training(str(held)).rule == RaceRule(fraction=0.5, k=None, wait=0.75, hold=1.0)
    assert plan_training(planned, stops={"hold": 0.5}).rule == RaceRule(fraction=0.5, k=None, wait=0.75, hold=0.5)
    assert plan_training(plain, race=0.75, k=None, stops={"hold": 2.0}).rule == RaceRule(fraction=0.75, k=None, hold=2.0)
    with pytest.raises(InputError, match="--race-hold sets when a race stops.*runs none"):
        plan_training(plain, stops={"hold": 1.0})
    from capacity_advisor.training.manifest_checks import race_problems

    assert race_problems({**PLANNED, "hold": 1.0}) == []
    for bad in (-0.5, 11, "x", True):
        assert any(p.startswith("race.hold:") for p in race_problems({**PLANNED, "hold": bad})), bad
