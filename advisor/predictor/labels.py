"""From RunRecords to labelled rows: what was measured, and which set won at each budget.

    rows = label_rows(read_records("calibration/records.jsonl"))

Labels follow the paper's protocol: for a unit (pool source, ranking, student, seed) and a budget
of E epochs, each set is worth its best checkpoint accuracy up to epoch E, and the label is the
best set. Near-ties (within `tie_margin`) go to the cheaper, steadier choice, high > mixed > low.

Every row says where it came from, so held-out tables can leave out any of them: `student`,
`shape`, `source` (a task and the teacher that wrote its candidates, at its temperature, in one
version of the lab), `task` (the family), `teacher` (the model or program that wrote the pool).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from capacity_advisor.core.numbers import number, whole
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.jsonl import read_jsonl
from capacity_advisor.models.lab.ladder import LAB_TEACHER
from capacity_advisor.models.lab.tasks import SCRIPTED_TEACHERS
from capacity_advisor.training.manifest import option_of, option_order, schedule_of

BUDGETS = (0.5, 1, 2, 3, 4, 5)

# Measured on the student by the probe and the selection; none of them grows with model size.
PROBE_FEATURES = (
    "budget", "ranking_sum",
    "likelihood_gap_per_token", "length_ratio_low_high",
    "base_accuracy", "base_repetition_rate",
    "high_train_loss_drop_rel", "low_train_loss_drop_rel", "gap_train_loss_drop_rel",
    "high_teacher_nll_drop_rel", "low_teacher_nll_drop_rel", "gap_teacher_nll_drop_rel", "low_teacher_nll_low_drop_rel",
    "high_drift_rel", "low_drift_rel",
    "low_repetition_area", "low_repetition_peak", "gap_repetition_area",
    "high_answer_logprob_area_gain", "low_answer_logprob_area_gain", "gap_answer_logprob_area_gain",
    "high_accuracy_area_gain", "low_accuracy_area_gain", "gap_accuracy_area_gain",
    "gap_answer_rate_gain",
)
# Only with a teacher model in the probe (always in the lab; rarely for real students).
TEACHER_FEATURES = ("high_teacher_view_drop_rel", "low_teacher_view_drop_rel", "gap_teacher_view_drop_rel")
# Contrasts within a unit: D_low against D_high, each relative to the base where it has a level.
# A level (the base accuracy, a loss, the likelihood gap) tells a task or a pool source apart; a
# contrast says how the two sets moved the same student on the same problems.
CONTRAST_FEATURES = (
    "budget", "ranking_sum",
    "gap_train_loss_drop_rel", "gap_teacher_nll_drop_rel", "gap_drift_rel", "gap_repetition_area",
    "gap_accuracy_gain_headroom", "gap_answer_logprob_gain_rel", "gap_answer_rate_gain",
)
# Measured without training the student: the run's settings, the pool's own contrasts under the
# base (likelihood gap, length ratio) and the base's evaluation. Whether these carry to a new task
# or teacher better than the probe's training curves: `advisor fit --features untrained`.
UNTRAINED_FEATURES = ("budget", "ranking_sum", "likelihood_gap_per_token", "length_ratio_low_high",
                      "base_accuracy", "base_repetition_rate", "base_answer_rate", "base_finish_rate")
FEATURE_SETS = {
    "probe": PROBE_FEATURES,
    "untrained": UNTRAINED_FEATURES,
    "probe+teacher": PROBE_FEATURES + TEACHER_FEATURES,
    "contrast": CONTRAST_FEATURES,
    "contrast+teacher": CONTRAST_FEATURES + ("gap_teacher_view_drop_rel",),
}
NOT_MEASURED = ("budget", "ranking_sum")  # the run's settings: columns of the fit that no probe measures
TIE_MARGIN = 0.01  # accuracy within which two options count as tied (1 point)


def within(value: float, best: float, tie_margin: float = TIE_MARGIN) -> bool:
    """`value` is within the tie margin of `best`: the one comparison labels and decisions share."""
    return value >= best - tie_margin - 1e-9


def _num(v) -> float:
    if isinstance(v, bool):
        return float("nan")
    try:
        x = float(v)
    except (TypeError, ValueError, OverflowError):
        return float("nan")
    return x if math.isfinite(x) else float("nan")


def accuracy_lead(f: dict) -> float:
    """The probe's lead for D_low: D_low's held-out accuracy gain over the base minus D_high's
    (`gap_accuracy_gain` where only that is stated; NaN where neither was measured)."""
    gain = _num(f.get("low_accuracy_gain")) - _num(f.get("high_accuracy_gain"))
    return _num(f.get("gap_accuracy_gain")) if math.isnan(gain) else gain


def learning_speed(f: dict) -> float:
    """How fast the student learns the task in the probe: the larger of D_high's and D_low's held-out
    accuracy gains over the base (NaN where neither was measured). A student that gains this much in
    the probe's few steps shows the better set early, so a race can stop sooner (`gate.Gate.fast_gain`)."""
    gains = [g for g in (_num(f.get("high_accuracy_gain")), _num(f.get("low_accuracy_gain"))) if math.isfinite(g)]
    return max(gains) if gains else float("nan")


def contrasts(f: dict) -> dict:
    """The contrast inputs derived from a probe's features (NaN where an ingredient is missing)."""
    base_acc, base_lp = _num(f.get("base_accuracy")), _num(f.get("base_answer_logprob"))
    out = {}
    gain = accuracy_lead(f)
    out["gap_accuracy_gain_headroom"] = gain / max(1.0 - base_acc, 0.05) if math.isfinite(base_acc) else float("nan")
    lp = _num(f.get("gap_answer_logprob_gain"))
    out["gap_answer_logprob_gain_rel"] = lp / max(abs(base_lp), 1e-3) if math.isfinite(base_lp) else float("nan")
    return out


def inputs(f: dict) -> dict:
    """A feature dict with its derived contrasts added (measured values are never replaced)."""
    return {**contrasts(f), **f}


def ranking_sum(score: str) -> float:
    """The `ranking_sum` column: whether the candidates were ranked by summed log-probability."""
    return float(score == "sum")


def model_inputs(measured: dict, budget: float, score: str) -> dict:
    """The one place the run's settings join what was measured: the columns a fitted model reads,
    from a probe's measurements (and the selection's gap and length ratio), the epoch budget and
    the ranking. Everything else passes the budget and the ranking as arguments."""
    return {**measured, "budget": float(budget), "ranking_sum": ranking_sum(score)}


ROW_COLUMNS = "_columns"  # a label row's inputs as `matrix` reads them, kept in the row (one fit reads a row many times)
# (kept with the features dict they were read from: a row's `features` are never changed in place)


def matrix(rows_or_inputs: Sequence[dict], features: Sequence[str]) -> np.ndarray:
    """The columns `features` of label rows (measured `features`, `budget`, `score`) or of dicts
    already joined by `model_inputs`. A label row's columns are computed once per feature set and
    kept in the row: an ensemble's members and folds read the same rows again and again."""
    key = tuple(features)
    out = []
    for r in rows_or_inputs:
        if "features" not in r:  # inputs already joined by model_inputs: their contrasts derived here
            f = inputs(r)
            out.append([_num(f.get(k)) for k in key])
            continue
        kept = r.setdefault(ROW_COLUMNS, {})
        made = kept.get(key)
        # valid for these very features (a copy of the row with other features, {**row, ...}, recomputes)
        if made is None or made[0] is not r["features"] or made[1] != (r["budget"], r["score"]):
            f = inputs(model_inputs(r["features"], r["budget"], r["score"]))
            made = kept[key] = (r["features"], (r["budget"], r["score"]), [_num(f.get(k)) for k in key])
        out.append(made[2])
    return np.array(out, dtype=float).reshape(len(out), len(key))


# ---- records ------------------------------------------------------------------------------------


def read_records(path: str | Path) -> list[dict]:
    """The records of one file, each checked (`_record_problem`). Every number must be finite: a
    NaN feature or accuracy would reach the fit as a measurement (our writers store null). A last
    line cut short (a killed append to the records store: its run wrote no record.json, and appends
    its record again when rerun) is left out."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"records file {path} does not exist: run `advisor calibrate`, `advisor lab calibrate` or "
                         "`advisor train` first")
    if p.is_dir():
        raise InputError(f"{path} is a folder: name its records file (e.g. {p / 'records.jsonl'}); a published "
                         "calibration folder is read by `advisor lab replay FOLDER --out FILE`")
    from capacity_advisor.core.files import special_kind

    kind = special_kind(p)
    if kind is not None:
        raise InputError(f"records file {path} is {kind}, not a regular file: name a records file written by "
                         "`advisor calibrate`, `advisor lab calibrate` or `advisor train`")
    if p.suffix in (".xz", ".gz", ".bz2", ".zst"):
        raise InputError(f"{path} is compressed: a published calibration's files are replayed into a records file by "
                         "`advisor lab replay FOLDER --out FILE`; name that file")
    try:
        records = read_jsonl(p, strict=True, torn=[])
    except (ValueError, RecursionError) as e:
        raise InputError(f"{str(e)[:200]}: remove the damaged line from the records file") from None
    if not records:
        raise InputError(f"records file {path} holds no records (it is empty or blank): name a records file written "
                         "by `advisor calibrate`, `advisor lab calibrate` or `advisor train`, or leave this one out")
    for n, rec in enumerate(records, 1):
        why = _record_problem(rec)
        if why:
            raise InputError(f"{path} line {n}: {why}; is this a records file written by `advisor calibrate`, "
                             "`advisor lab calibrate` or `advisor train`?")
    return records


def _record_problem(rec) -> str | None:
    """What makes a record unusable, or None. Only the fields labelling reads are checked."""
    if not isinstance(rec, dict):
        return "a record must be an object"
    if not isinstance(rec.get("model"), dict):
        return "'model' must be an object"
    n = rec["model"].get("n_params")
    if not whole(n, 1, 10**15):
        return "'model.n_params' must be a whole number"
    if not isinstance(rec.get("strategy"), str):
        return "'strategy' must be text"
    for key in ("features", "pool", "settings", "unit"):
        if rec.get(key) is not None and not isinstance(rec[key], dict):
            return f"'{key}' must be an object"
    for key in ("training", "probe"):
        if (rec.get("settings") or {}).get(key) is not None and not isinstance(rec["settings"][key], dict):
            return f"'settings.{key}' must be an object"
    evals = rec.get("evals")
    if not isinstance(evals, list) or not evals or not all(isinstance(e, dict) for e in evals):
        return "'evals' must be a non-empty list of objects"
    for e in evals:
        if not number(e.get("epoch")):
            return "every eval needs a numeric 'epoch'"
        step = e.get("step", 1)
        if not whole(step):
            return "an eval's 'step' must be a whole number"
        acc = e.get("accuracy")
        if acc is not None and not number(acc):
            return "an eval's 'accuracy' must be a number or null"
    return None


def unit_of(rec: dict) -> dict:
    """Where a record's run came from: source, task, teacher, ranking, student, seed, build and
    repeat (`repeat_of`). A lab student's builds are one student: `lab:m+b1` is `lab:m`, build 1."""
    u = rec.get("unit")
    if isinstance(u, dict):
        teacher = str(u.get("teacher", LAB_TEACHER))  # records from before the unit named its teacher
        temperature = _num(u.get("temperature", 1.0))
        family = str(u.get("task"))
        writer = teacher if teacher in SCRIPTED_TEACHERS else f"{teacher}@T{temperature:g}"
        out = {"task": family, "teacher": teacher, "source": f"lab{u.get('lab', 1)}:{family}/{writer}",
               "score": str(u.get("score")), "student": f"lab:{u.get('size')}", "seed": u.get("seed"),
               "build": u.get("build", 0)}
    else:
        m, pool = rec.get("model") or {}, rec.get("pool") or {}
        task = str(pool.get("task") or pool.get("fingerprint") or pool.get("source"))
        teacher = str(pool.get("teacher") or "unknown")
        out = {"task": task, "teacher": teacher, "source": f"{task}/{teacher}", "score": str(pool.get("score", "sum")),
               "student": str(m.get("spec") or m.get("fingerprint")), "seed": (rec.get("settings") or {}).get("seed", 0),
               "build": 0}
    return {**out, "repeat": repeat_of(out["seed"], out["build"])}


def repeat_of(seed, build) -> object:
    """What tells apart the repeats of one student on one pool source: the seed (pool draw and
    data order), and for a lab student pretrained from another seed its build too (`b1-s0`).
    The ladder's own build is the seed alone, so records from before builds keep their names."""
    return seed if not build else f"b{build}-s{seed}"


def best_up_to(evals: Sequence[dict], budget: float) -> float:
    accs = [e["accuracy"] for e in evals
            if e.get("accuracy") is not None and e.get("step", 1) > 0 and e["epoch"] <= budget + 1e-9]
    return max(accs) if accs else float("nan")


def record_option(rec: dict) -> str | None:
    """The schedule a run trained on (high, low, mixed, mixed@F, curriculum@E), or None."""
    training = ((rec.get("settings") or {}).get("training") or {})
    try:
        name = option_of(rec.get("strategy"), rec.get("mix"), training.get("switch_epoch"))
        schedule_of(name)
    except (InputError, TypeError, ValueError):
        return None
    return name


def options_in(rows: Sequence[dict]) -> tuple[str, ...]:
    """Every option any row measured, in preference order."""
    return tuple(sorted({o for r in rows for o in r["accuracy"]}, key=option_order))


def shape_of(model: dict) -> str:
    """balanced, deep-narrow or shallow-wide, from hidden size per layer (as the lab ladder defines them)."""
    h, n = model.get("hidden_size"), model.get("n_layers")
    if not h or not n:
        return "unknown"
    per_layer = h / n
    return "deep-narrow" if per_layer < 16 else "shallow-wide" if per_layer > 64 else "balanced"


def tokens_per_epoch(rec: dict) -> float | None:
    """The tokens one epoch of this run trained (its record's provenance.train_tokens over its epochs);
    None where the record does not say."""
    tokens, epochs = (rec.get("provenance") or {}).get("train_tokens"), rec.get("epochs")
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
             for v in (tokens, epochs))
    return tokens / epochs if ok else None


def token_share(per_epoch: dict, kept: str, share: float) -> float | None:
    """What a race that stopped at `share` of the budget and kept `kept` trained beyond the kept set's own
    run, in tokens, as a share of that run's tokens: share x (the losing set's tokens per epoch over the
    kept set's). D_low's responses are often several times D_high's, so the same share of a run costs
    far more where D_high is kept. None where a set's tokens are unknown."""
    if share <= 0:
        return 0.0
    lost = {"high": "low", "low": "high"}.get(kept)
    a, b = per_epoch.get(lost), per_epoch.get(kept)
    return share * a / b if a and b else None


def label_rows(records: Iterable[dict], budgets: Sequence[float] = BUDGETS, tie_margin: float = 0.01) -> list[dict]:
    """One row per (unit, budget) that has both a high and a low run: the unit's measured
    `features`, its `budget` and ranking (`score`) beside them, the accuracies and the label.

    The label is the best option at the budget; near-ties (within `tie_margin`) go to the cheaper,
    steadier option (`training.manifest.option_order`: high, mixes, curricula, low)."""
    groups: dict[tuple, dict[str, dict]] = defaultdict(dict)
    where: dict[tuple, dict] = {}
    for rec in records:
        option = record_option(rec)
        if option and isinstance(rec.get("evals"), list):
            u = unit_of(rec)
            key = (u["source"], u["score"], u["student"], u["repeat"])
            groups[key][option] = rec
            where[key] = u
    tokens = {key: {s: tokens_per_epoch(r) for s, r in runs.items()} for key, runs in groups.items()}
    for key, per in tokens.items():  # a record that lacks its tokens (a run resumed before they were kept)
        for s in per:  # borrows them from another repeat's run of the same set on as many problems: the same
            if per[s] is None:  # problems at every seed of the real student's units, a close count elsewhere
                n = groups[key][s].get("n_train")
                per[s] = next((v[s] for k, v in tokens.items() if k[:3] == key[:3] and v.get(s)
                               and groups[k][s].get("n_train") == n), None)
    rows = []
    for key, runs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        if "high" not in runs or "low" not in runs:
            continue
        u = where[key]
        name = "|".join(map(str, key))
        horizon = min(max(e["epoch"] for e in r["evals"]) for r in runs.values())
        first = runs["high"]
        model = first.get("model") or {}
        for budget in [b for b in budgets if b <= horizon + 1e-9]:
            accs = {s: best_up_to(r["evals"], budget) for s, r in runs.items()}
            if any(math.isnan(a) for a in accs.values()):
                continue
            best = max(accs.values())
            near = sorted((s for s in accs if within(accs[s], best, tie_margin)), key=option_order)
            rows.append({
                "group": name, "unit": name,
                "student": u["student"], "source": u["source"], "task": u["task"], "teacher": u["teacher"],
                "score": u["score"], "seed": u["seed"], "build": u["build"], "repeat": u["repeat"], "budget": float(budget),
                "n_params": model.get("n_params"),
                "shape": shape_of(model),
                "features": {k: v for k, v in (first.get("features") or {}).items() if k not in NOT_MEASURED},
                "accuracy": accs,
                "tokens": tokens[key],  # per epoch of each set's run (`tokens_per_epoch`)
                "label": near[0],
                "tie": len(near) > 1,
            })
    return rows
