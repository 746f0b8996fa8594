"""Racing D_high against D_low: train both on the manifest's schedule, keep the leader.

    from capacity_advisor.training.race import RaceRule, run_race
    summary = run_race("rec/recommendation.json", "runs/race", RaceRule(fraction=0.5))

The two runs (OUT/race/high, OUT/race/low) are ordinary run folders of `training.sft`: each is the
manifest with its `dataset` set to that set's file (`sets.high` / `sets.low`, or `dataset` for the
set named by `strategy`) and per-problem correctness kept in eval.jsonl. They advance one
evaluation at a time in turn (`run_sft(pause_after_evals=1)`): a paused run resumes from its
checkpoint exactly as after a kill, with the learning-rate schedule of the whole budget from the
start, so the winner continued to the end is the uninterrupted run of that set.

At each evaluation the two are compared on the same held-out problems, paired: per problem,
correct under D_high minus correct under D_low. A set leads when the mean difference is beyond
both `z` standard errors of that mean and `margin` (accuracy, 0.05 = 5 points). The race stops when
the same set has led at `k` evaluations in a row ("lead"; never with `k` None; with `patient`, a
D_high lead only once D_low has had three evaluations and is not gaining, `holds_back`), or at the first evaluation at or past `fraction` of the budget
("fraction"), where the set with the best held-out accuracy so far is kept (D_high on ties; with
`hold`, D_low only where its best leads D_high's by more than `hold` standard errors of the
difference over the problems evaluated, `keeps_low`: a lead of a problem or two on a small held-out
slice is noise, and D_high, the set that costs nothing to keep, is kept). With
`tie`, at the first evaluation at or past that share the race stops for D_high ("tie") where D_low
has not been ahead at any evaluation and is not gaining on it (`levels`): a D_low that shows
nothing early costs no more. With
`wait`, a race due to stop goes on while D_low is behind and gaining faster than D_high
(`gaining`), up to that share ("wait" when it ends there). The winner then trains to the end; the
loser's folder stays as it is.

Each raced run also evaluates at the first step at or past each share the rule may stop at without
a lead (`RaceRule.shares`: its tie check, fraction and wait; `training.eval_at`), so a race stops
at its share, not at the next evaluation of the manifest's schedule — where both sets have as many
rows, so that both runs evaluate at the same steps (evaluations are paired by their order). The
extra evaluations count as evaluations for `k`, the wait's window and `holds_back`.

OUT/race.json says what raced, the paired comparison at every evaluation, when and why the race
stopped and the winner; the winner's RunRecord carries the same under provenance.race. A rerun of
the same race resumes it: the decision is recomputed from the runs' eval.jsonl files.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import folder_lock, recorded_key, refuse_special, stable_hash, write_json
from capacity_advisor.models import loading
from capacity_advisor.training import sft
from capacity_advisor.training.launch import launch_command
from capacity_advisor.training.data import read_sft_rows
from capacity_advisor.training.manifest import Manifest, SETS, load_manifest
from capacity_advisor.training.record import best_checkpoint, write_record
from capacity_advisor.training.run_check import check_run, run_key, with_overrides

RACED = SETS[:2]  # high, low: D_high first, so it is preferred on ties
RACE_VERSION = 1


@dataclass(frozen=True)
class RaceRule:
    """When a race stops. The defaults of k and margin are provisional (chosen from replays of
    the committed records, not yet from held-out pool sources); the race a recommendation plans
    (its manifest's `race`) sets k None and the fraction and wait its policy chose held out."""

    fraction: float  # stop at the first evaluation at or past this share of the budget, in (0, 1]
    k: int | None = 2  # evaluations in a row that the same set must lead; None: no stop on a lead
    margin: float = 0.05  # the least mean paired difference that counts as a lead (accuracy)
    z: float = 1.96  # standard errors of the mean paired difference that a lead must exceed
    wait: float | None = None  # go on up to this share while D_low is behind and gaining faster
    patient: bool = False  # a D_high lead stops it only once D_low is seen not gaining (`holds_back`)
    tie: float | None = None  # at this share it stops for D_high unless D_low has been ahead or is gaining (`levels`)
    hold: float = 0.0  # at a stop without a lead, D_low is kept only on a lead beyond this many standard errors (`keeps_low`)

    def shares(self) -> list[float]:
        """The shares of the budget at which this rule may stop the race without a lead (its tie check,
        fraction and wait, below the whole budget): each raced run evaluates at the first step at or
        past each (`training.eval_at`), so the race stops at its share, not at the next evaluation
        of the schedule."""
        return sorted({float(x) for x in (self.tie, self.fraction, self.wait) if x is not None and x < 1})

    def check(self) -> "RaceRule":
        bad = []
        if not (isinstance(self.fraction, (int, float)) and math.isfinite(self.fraction) and 0 < self.fraction <= 1):
            bad.append(f"--race {self.fraction} must be a share of the budget in (0, 1], e.g. 0.5")
        elif self.wait is not None and not (isinstance(self.wait, (int, float)) and self.fraction < self.wait <= 1):
            bad.append(f"race wait {self.wait} must be a share of the budget above the fraction {self.fraction:g}, at most 1")
        if not (self.k is None or (isinstance(self.k, int) and not isinstance(self.k, bool) and self.k >= 1)):
            bad.append(f"--race-k {self.k} must be a whole number ≥ 1")
        if not (isinstance(self.margin, (int, float)) and math.isfinite(self.margin) and 0 <= self.margin < 1):
            bad.append(f"--race-margin {self.margin} must be an accuracy difference in [0, 1), e.g. 0.05")
        if self.tie is not None and not (isinstance(self.tie, (int, float)) and not isinstance(self.tie, bool)
                                         and isinstance(self.fraction, (int, float)) and 0 < self.tie < self.fraction):
            bad.append(f"--race-tie {self.tie} must be a share of the budget above 0 and below the race's fraction "
                       f"{self.fraction}, e.g. 0.3")
        if not (isinstance(self.hold, (int, float)) and not isinstance(self.hold, bool) and math.isfinite(self.hold)
                and 0 <= self.hold <= 10):
            bad.append(f"--race-hold {self.hold} must be a number of standard errors from 0 to 10, e.g. 1")
        if not (isinstance(self.z, (int, float)) and math.isfinite(self.z) and self.z >= 0):
            bad.append(f"z {self.z} must be ≥ 0")
        if bad:
            raise InputError("; ".join(bad))
        return self


TIE_WORDS = "it stops for D_high unless D_low has been ahead at an evaluation or is gaining"  # the tie check, as reports say it
WAIT_WINDOW = 2  # evaluations over which `gaining` compares the two sets' gains


def gaining(acc_high: list, acc_low: list, window: int = WAIT_WINDOW) -> bool:
    """D_low is behind (its best accuracy so far below D_high's) and has gained more than D_high
    over the last `window` evaluations: a slow starter that may yet overtake. The lists hold each
    set's accuracy at the evaluations so far, paired by order."""
    pairs = [(h, lo) for h, lo in zip(acc_high, acc_low) if h is not None and lo is not None]
    if len(pairs) <= window:
        return False
    (h0, l0), (h1, l1) = pairs[-1 - window], pairs[-1]
    return max(lo for _, lo in pairs) < max(h for h, _ in pairs) and l1 - l0 > h1 - h0 + 1e-9


def keeps_low(best_high: float, best_low: float, problems: int, hold: float = 0.0) -> bool:
    """Whether a race stopped without a lead keeps D_low: its best held-out accuracy so far is above
    D_high's, by more than `hold` standard errors of the difference of the two accuracies over
    `problems` held-out problems each (0: by anything; D_high on ties)."""
    if not best_low > best_high:
        return False
    if hold <= 0 or problems <= 0:
        return True
    h, lo = (min(1.0, max(0.0, a)) for a in (best_high, best_low))
    return best_low - best_high > hold * math.sqrt((h * (1 - h) + lo * (1 - lo)) / problems) + 1e-12


def levels(acc_high: list, acc_low: list, window: int = WAIT_WINDOW) -> bool:
    """Whether a race with a tie check stops there for D_high: D_low has not been ahead at any
    evaluation (above D_high's accuracy at the same one) and is not gaining on it (`gaining`, which
    needs `window` + 1 evaluations). A race whose D_low shows nothing by the check costs no more;
    one whose D_low led at some evaluation, even if overtaken since, or climbs, goes on."""
    pairs = [(h, lo) for h, lo in zip(acc_high, acc_low) if h is not None and lo is not None]
    if not pairs:
        return False
    return not any(lo > h for h, lo in pairs) and not gaining(acc_high, acc_low, window)


def holds_back(acc_high: list, acc_low: list, window: int = WAIT_WINDOW) -> bool:
    """Whether a patient race lets a D_high lead pass: too few evaluations yet to tell whether D_low
    is gaining (`window` + 1 are needed), or D_low behind and gaining faster (`gaining`). A slow
    starter is not ruled out by D_high's early lead; a D_low lead always stops a race at once."""
    pairs = [(h, lo) for h, lo in zip(acc_high, acc_low) if h is not None and lo is not None]
    return len(pairs) <= window or gaining(acc_high, acc_low, window)


def set_files(m: Manifest) -> dict[str, str | None]:
    """Each raced set's data file as the manifest names it (relative to its folder), or None."""
    sets = m.sets if isinstance(m.sets, dict) else {}
    return {s: sets.get(s) or (m.dataset if m.strategy == s else None) for s in RACED}


def race_manifests(m: Manifest, eval_at: list[float] | None = None) -> dict[str, Manifest]:
    """The manifest of each raced run: `m` on that set's data, per-problem correctness kept, and
    evaluated also at the shares of the budget in `eval_at` (the rule's decision points,
    `RaceRule.shares`) beside the manifest's schedule and its own `eval_at`. InputError when `m` does not name both sets, or has no held-out evaluation to compare them."""
    files = set_files(m)
    missing = [f"D_{s} (sets.{s})" for s, f in files.items() if not f]
    if missing:
        raise InputError(f"a race needs both D_high and D_low, and the manifest names no {' or '.join(missing)}: "
                         "rerun `advisor recommend` (it writes train-high.jsonl and train-low.jsonl) or add "
                         '"sets": {"high": FILE, "low": FILE} to the manifest')
    paths = {s: m.resolve(f) for s, f in files.items()}
    if paths["high"].resolve() == paths["low"].resolve():
        raise InputError(f"D_high and D_low are the same file ({files['high']}): a race needs the two sets' own data; "
                         "rerun `advisor recommend`, or point sets.high / sets.low at the two files")
    if m.eval_path is None or m.eval.checker == "none":
        raise InputError("a race compares the sets on held-out problems, and the manifest has no eval.path with a "
                         "checker (lab or math): give the manifest an eval set and eval.checker, or train one set "
                         "(--no-race where the recommendation planned the race)")
    shares = sorted(set(m.training.eval_at or ()) | set(eval_at or ()))  # the manifest's own, and the rule's
    training = replace(m.training, switch_epoch=None, eval_at=shares or None)
    out = {}
    for s, f in files.items():
        out[s] = replace(m, dataset=f, strategy=s, mix=0.0, sets={}, race=None, training=training,
                         eval=replace(m.eval, per_problem=True)).validate(where=f"manifest of the D_{s} run")
    return out


# ---- the decision ------------------------------------------------------------------------
def paired(row_high: dict, row_low: dict, rule: RaceRule) -> dict:
    """The paired comparison of one evaluation: the mean per-problem difference (high - low),
    its standard error, and the set that leads beyond noise (None when neither does)."""
    ch = (row_high.get("per_problem") or {}).get("correct")
    cl = (row_low.get("per_problem") or {}).get("correct")
    if not ch or not cl or len(ch) != len(cl):
        raise InputError(f"evaluation at step {row_high['step']} lacks per-problem correctness for both sets "
                         "(eval.jsonl of another run?): delete the race folder to start over")
    d = [int(a) - int(b) for a, b in zip(ch, cl)]
    n = len(d)
    mean = sum(d) / n
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n) if n > 1 else 0.0
    lead = None
    if abs(mean) > max(rule.z * se, rule.margin):
        lead = "high" if mean > 0 else "low"
    return {"step": row_high["step"], "epoch": row_high["epoch"], "accuracy_high": row_high.get("accuracy"),
            "accuracy_low": row_low.get("accuracy"), "mean_difference": mean, "standard_error": se,
            "problems": n, "leader": lead}


def budget_share(row: dict, m: Manifest) -> float:
    """How much of the budget a run had trained at an evaluation row (1 at the last)."""
    t = m.training
    share = row["step"] / t.max_steps if t.max_steps else row["epoch"] / float(t.epochs)
    return min(1.0, share)


def decide(curves: dict[str, list[dict]], rule: RaceRule, m: Manifest, finished: bool = False
           ) -> tuple[list[dict], dict | None]:
    """The comparisons so far (trained evaluations paired by their order) and the stop, if the
    race has stopped: {"reason", "winner", "step", "epoch", "share", "evaluation"}. `finished`:
    neither run can go on, so the last pair ends the race whatever its share."""
    high, low = ([r for r in curves[s] if r["step"] > 0] for s in RACED)
    n = min(len(high), len(low))
    comps: list[dict] = []
    streak, best, waited, checked = 0, {s: -math.inf for s in RACED}, False, rule.tie is None
    for i in range(n):
        c = paired(high[i], low[i], rule)
        c["share"] = budget_share(high[i], m)
        comps.append(c)
        prev = comps[-2]["leader"] if len(comps) > 1 else None
        streak = (streak + 1 if c["leader"] == prev else 1) if c["leader"] else 0
        for s in RACED:
            acc = c[f"accuracy_{s}"]
            best[s] = max(best[s], acc if acc is not None else -math.inf)
        stop = None
        seen = ([x["accuracy_high"] for x in comps], [x["accuracy_low"] for x in comps])
        due = c["share"] >= rule.fraction - 1e-9
        waits = due and rule.wait is not None and c["share"] < rule.wait - 1e-9 and gaining(*seen)
        waited = waited or waits
        tie_due = not checked and c["share"] >= rule.tie - 1e-9  # the first evaluation at or past the tie check
        checked = checked or tie_due
        if rule.k is not None and streak >= rule.k and not (rule.patient and c["leader"] == "high" and holds_back(*seen)):
            stop = {"reason": "lead", "winner": c["leader"]}
        elif tie_due and levels(*seen):
            stop = {"reason": "tie", "winner": "high"}
        elif (due and not waits) or (finished and i == n - 1):
            reason = "wait" if waited else "fraction"
            stop = {"reason": reason,
                    "winner": "low" if keeps_low(best["high"], best["low"], c["problems"], rule.hold) else "high"}
        if stop:
            stop.update({"step": c["step"], "epoch": c["epoch"], "share": c["share"], "evaluation": i + 1})
            return comps, stop
    return comps, None


# ---- the race ----------------------------------------------------------------------------
def run_race(manifest: str | os.PathLike | Manifest, out: str | os.PathLike, rule: RaceRule, records: str | None = None,
             device: str = "auto", dtype: str = "auto", threads: int = 0, epochs: float | None = None,
             max_steps: int | None = None, stream=None, launch: dict | None = None) -> dict:
    """Race, continue the winner to the end of the schedule, and return the race's summary (also
    OUT/race.json). Every input is checked before any training. `launch` ({"nproc", "launcher",
    "accelerate_config"}, nproc > 1; `manifest` then a file): each run's segments are launched over
    that many processes (`python -m capacity_advisor.training.sft --race-set S ...`) instead of run here.
    A second race into OUT while this one runs is refused (`core.files.folder_lock`)."""
    stream = stream or sys.stderr
    m, runs, folders, checked, key = check_race(manifest, out, rule, device, dtype, epochs, max_steps,
                                                world=(launch or {}).get("nproc", 1))
    with folder_lock(out):  # one race at a time in OUT: a second is refused while this one runs
        return _run_race(m, runs, folders, checked, key, Path(out), rule, records, stream, launch, manifest,
                         dict(device=device, dtype=dtype, threads=threads, epochs=epochs, max_steps=max_steps))


def _run_race(m: Manifest, runs: dict, folders: dict, checked: dict, key: str, out: Path, rule: RaceRule,
              records: str | None, stream, launch: dict | None, manifest, kw: dict) -> dict:
    from capacity_advisor.training.callbacks import read_curve

    write_json(out / "config.json", {"stage": "race", "race_key": key, "rule": asdict(rule),
                                     "runs": {s: str(folders[s]) for s in RACED}})
    segment = Segments(m, runs, folders, checked, launch, manifest, kw, stream)
    while True:
        curves = {s: read_curve(folders[s] / "eval.jsonl") for s in RACED}
        going = [s for s in RACED if not (folders[s] / "record.json").exists()]
        comps, stop = decide(curves, rule, m, finished=not going)
        summary = describe(m, rule, folders, comps, stop, out)
        write_json(out / "race.json", summary)
        if stop:
            break
        # the run behind goes next (D_high first when level); a finished run cannot go on
        segment(min(going, key=lambda s: len([r for r in curves[s] if r["step"] > 0])), pause=True)
    winner = stop["winner"]
    then = "kept" if stop["share"] >= 1 else "continues to the end"
    stream.write(f"race stopped at step {stop['step']} ({stop['share']:.0%} of the budget, {stop['reason']}): "
                 f"D_{winner} {then}\n")
    note = {"race": {k: summary[k] for k in ("raced", "rule", "comparisons", "stopped", "winner")}}
    if not (folders[winner] / "record.json").exists():
        segment(winner, pause=False)
    # stored only once it has won, with the race's note; a rerun of a finished race reads its record
    record = finished_in_race(folders[winner], note, records) or segment.done(winner)
    summary.update(status="done", record=str(folders[winner] / "record.json"),
                   best_accuracy=record.get("best_accuracy"), final_accuracy=record.get("final_accuracy"),
                   best_checkpoint=best_checkpoint(folders[winner], record))
    loser = summary["loser"]
    lost, kept = tokens_trained(folders[loser]), (record.get("provenance") or {}).get("train_tokens")
    kept = kept if isinstance(kept, int) and not isinstance(kept, bool) and kept > 0 else None
    summary["extra_tokens"] = {"loser": lost, "winner": kept, "share": lost / kept if lost and kept else None}
    write_json(out / "race.json", summary)
    return summary


def tokens_trained(folder: Path) -> int | None:
    """The tokens a raced run trained (non-padding, all processes): its record's where it finished,
    else its newest complete checkpoint's trainer state (where it stopped when the race did); None
    where neither states them."""
    import json

    from capacity_advisor.training.run_check import checkpoints

    state = None
    try:
        if (folder / "record.json").is_file():
            state = (json.loads((folder / "record.json").read_text(encoding="utf-8")).get("provenance") or {}).get(
                "train_tokens")
        else:
            done = [path for _, path, ok in checkpoints(folder) if ok]
            if done:
                state = json.loads((done[-1] / "trainer_state.json").read_text(encoding="utf-8")).get(
                    "num_input_tokens_seen")
    except (OSError, ValueError, AttributeError):
        return None
    return state if isinstance(state, int) and not isinstance(state, bool) and state > 0 else None


class Segments:
    """Advances one raced run: by one evaluation (`pause`), or to its end, kept out of the records
    store (a run is stored once it has won, `finished_in_race`), its best checkpoint kept. In this
    process (the base student loaded once for both runs), or launched over several processes."""

    def __init__(self, m: Manifest, runs: dict, folders: dict, checked: dict, launch: dict | None, manifest, kw: dict,
                 stream):
        self.m, self.runs, self.folders, self.checked, self.launch = m, runs, folders, checked, launch
        self.manifest, self.kw, self.stream, self.lm = manifest, kw, stream, None

    def __call__(self, s: str, pause: bool) -> None:
        if self.launch:
            return self._launched(s, pause)
        if self.lm is None:
            self.lm = loading.load_model(self.m.model_spec, device="cpu", dtype=self.checked[s].precision[0])
        here = {k: self.kw[k] for k in ("device", "dtype", "threads")}
        sft.run_sft(self.runs[s], self.folders[s], lm=self.lm, pause_after_evals=1 if pause else None, store=False,
                    keep_best=True, stream=self.stream, step0_row=self.base_row(s), **here)

    def base_row(self, s: str) -> dict | None:
        """The base student's evaluation (step 0) the other raced run made already (their manifests
        differ in `dataset` only): `callbacks.base_row_of`."""
        from capacity_advisor.training.callbacks import base_row_of

        return base_row_of(self.folders[other] for other in RACED if other != s)

    def _launched(self, s: str, pause: bool) -> None:
        import subprocess

        import torch

        cmd = launch_command(str(self.manifest), str(self.folders[s]), self.launch["nproc"], self.launch["launcher"],
                             self.launch.get("accelerate_config"), cuda=torch.cuda.is_available(), race_set=s,
                             pause_after_evals=1 if pause else None, race_eval_at=self.runs[s].training.eval_at,
                             **self.kw)
        rc = subprocess.run(cmd).returncode
        if rc:
            raise InputError(f"the D_{s} run of the race exited with status {rc} (see the messages above); rerun the "
                             "same command to resume the race")

    def done(self, s: str) -> dict:
        """The record of a race already finished and stored (a rerun): read, nothing trained."""
        import json

        self.stream.write(f"{self.folders[s]} is already complete (record.json); pass a new --out to race again\n")
        return json.loads((self.folders[s] / "record.json").read_text(encoding="utf-8"))


def finished_in_race(folder: Path, note: dict, records: str | None) -> dict | None:
    """The winner's record, finished out of the store: the race's note added and the record
    stored now; None where it was stored already (a rerun of a finished race)."""
    import json

    path = folder / "record.json"
    record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    if record is None or "race" in (record.get("provenance") or {}):
        return None
    record["provenance"] = {**(record.get("provenance") or {}), **note}
    write_record(folder, record, records)
    return record


def check_race(manifest, out, rule: RaceRule, device: str, dtype: str, epochs, max_steps, world: int = 1):
    """(manifest, run manifests, run folders, check_run of each, the race's key): every refusal before
    any work (`world`: the processes each run is launched over)."""
    rule.check()
    m = manifest if isinstance(manifest, Manifest) else load_manifest(manifest)
    m = with_overrides(m, epochs=epochs, max_steps=max_steps)
    # the rule's shares are evaluated only where both sets have as many rows (as `advisor recommend` writes
    # them): the two runs then take the same steps, and `decide` pairs their evaluations by order
    rows = {s: read_sft_rows(p.dataset_path) for s, p in race_manifests(m).items()}  # read once, checked below
    runs = race_manifests(m, rule.shares() if len(rows["high"]) == len(rows["low"]) else None)
    folders = {s: Path(out) / "race" / s for s in RACED}
    key = race_key({s: run_key(runs[s]) for s in RACED}, rule)
    check_race_folder(Path(out), key)  # before the runs' own checks: a folder of another race is named as such
    checked = {s: check_run(runs[s], folders[s], world=world, device=device, dtype=dtype, rows=rows[s])
               for s in RACED}
    check_rule_fits(rule, runs, checked, world)
    return m, runs, folders, checked, key


def run_length(m: Manifest, n_rows: int, per_device: int, world: int) -> tuple[int, int]:
    """(optimizer steps, scheduled evaluations) of a run of `m` on `n_rows` rows, as the Trainer
    counts them: each process's batches per epoch over grad_accum, times the epochs (or max_steps)."""
    from capacity_advisor.training.callbacks import eval_schedule

    t = m.training
    per_epoch = max(math.ceil(math.ceil(n_rows / max(per_device * world, 1)) / t.grad_accum), 1)
    steps = t.max_steps or max(math.ceil(t.epochs * per_epoch), 1)
    return steps, len(eval_schedule(per_epoch, steps, t.evals_per_epoch, t.eval_every, t.eval_at or (),
                                    None if t.max_steps else t.epochs))


def check_rule_fits(rule: RaceRule, runs: dict, checked: dict, world: int) -> None:
    """InputError where the rule asks what these runs cannot hold: a share of the budget below one
    training step (the race would stop before either set trained), or a lead over more evaluations
    in a row than a run has (it could never stop on one; the default k, 2, stands on a run of one
    evaluation: the race then stops at its share)."""
    lengths = [run_length(runs[s], len(checked[s].rows), checked[s].per_device, world)
               for s in RACED if not checked[s].complete]
    if not lengths:
        return
    steps, evals = min(n for n, _ in lengths), min(e for _, e in lengths)
    if rule.fraction * steps < 1:
        raise InputError(f"--race {rule.fraction!r} is a share of the budget below one training step (a run here is "
                         f"{steps} steps): give a share of at least {1 / steps:.3g}")
    if rule.k is not None and rule.k > max(evals, RaceRule.k):
        raise InputError(f"--race-k {rule.k} asks for a lead at more evaluations in a row than a run here has "
                         f"({evals}): give at most {evals}")


def race_key(run_keys: dict[str, str], rule: RaceRule) -> str:
    """Identifies a race: both runs (their run keys: manifest, data, schedule) and the rule that
    decides between them. OUT/config.json records it; a folder holding another is refused."""
    rule_fields = asdict(rule)
    if not rule.patient:  # as keyed before races could be patient, so their folders still resume
        rule_fields.pop("patient")
    if rule.tie is None:  # ... and before they could check for a tie
        rule_fields.pop("tie")
    if not rule.hold:  # ... and before a D_low lead had to beat the noise
        rule_fields.pop("hold")
    return stable_hash({"runs": {s: run_keys[s] for s in RACED}, "rule": rule_fields})


def check_race_folder(out: Path, key: str) -> None:
    """OUT is resumed only by the race that made it: the same manifest, data and race rule. A folder
    another command made (a run, a recommendation) records another key, or none under race_key."""
    refuse_special(out, ("config.json", "race.json"), "remove it, or pass a new --out")
    if recorded_key(out, "race_key") not in (None, key):
        raise InputError(f"{out} holds something other than this race (a race of another manifest, data or rule "
                         "(--race, --race-k, --race-margin, --race-patient, --race-tie, --race-hold), or another command's output); pass a new --out "
                         "(or delete that folder to start over)")


def describe(m: Manifest, rule: RaceRule, folders: dict, comps: list[dict], stop: dict | None, out: Path) -> dict:
    """race.json: what raced, under which rule, each paired comparison, the stop and the winner."""
    winner = stop["winner"] if stop else None
    return {"version": RACE_VERSION, "model": m.model_spec, "epochs": m.training.epochs,
            "raced": {s: {"dataset": str(m.resolve(set_files(m)[s])), "run": str(folders[s])} for s in RACED},
            "rule": asdict(rule), "comparisons": comps, "stopped": stop, "winner": winner,
            "loser": None if winner is None else next(s for s in RACED if s != winner),
            "status": "racing" if stop is None else "continuing", "race_file": str(out / "race.json")}
