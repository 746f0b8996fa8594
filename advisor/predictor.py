"""The fitted predictor: scale-free probe measurements + the epoch budget -> high / low / mixed.

    rows = label_rows(read_records("calibration/records.jsonl"))
    table = cross_validate(rows, split="student")         # held-out students, against the baselines
    predictor = fit_predictor(rows, kind="logistic")      # a bagged ensemble, with its calibrated range
    predictor.save("predictor/"); Predictor.load("predictor/").advise(features)

Labels follow the paper's protocol: for a (student, pool, seed, ranking) and a budget of E epochs,
each strategy is worth its best checkpoint accuracy up to epoch E, and the label is the best
strategy. Near-ties (within `tie_margin`) go to the cheaper, steadier choice, high > mixed > low;
a choice within the margin of the best counts as right, and its regret is the real (small) gap.

Inputs mean the same thing for a 100k-parameter lab student and a 7B model: relative movements
measured on the student by the probe, the selection's own per-token statistics, the budget. The
parameter count is never an input of the probe-based model; it is shown, and it is what the
`--no-probe` priors use.

The predictor is an ensemble of members fitted on bootstrap resamples of the calibration units
(fitted in parallel with joblib); its spread gives an interval on each probability. It stores,
for every input, the calibrated range, and the standardized measurements of every calibration
unit, so `advise` can say whether a student is inside the data, which calibrated students are
nearest and what they measured, and derive its confidence from the interval and that check.

Saved as one JSON file: logistic coefficients, or LightGBM trees converted to arrays and
evaluated in numpy. Nothing is unpickled and no native parser sees the file; every array is
checked for shape and range on load, and a tree's children always come after their parent, so a
crafted file can neither crash nor hang the process.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Iterable, Sequence

import numpy as np

from capacity_advisor.models.errors import InputError
from capacity_advisor.models.files import atomic_path, finite, read_jsonl
from capacity_advisor.training.manifest import SETS, option_of, option_order, schedule_of

BUDGETS = (0.5, 1, 2, 3, 4, 5)
FORMAT = 2
MAX_FILE_BYTES = 64 << 20

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
FEATURE_SETS = {"probe": PROBE_FEATURES, "probe+teacher": PROBE_FEATURES + TEACHER_FEATURES}
KINDS = ("logistic", "lightgbm", "ridge")


# ---- records -> labelled rows ------------------------------------------------------------------


def read_records(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.exists():
        raise InputError(f"records file {path} does not exist: run `advisor calibrate` or `advisor train` first")
    try:
        records = read_jsonl(p)
    except (ValueError, RecursionError) as e:
        raise InputError(f"{str(e)[:200]}: remove the damaged line from the records file") from None
    for n, rec in enumerate(records, 1):
        why = _record_problem(rec)
        if why:
            raise InputError(f"{path} line {n}: {why}; is this a records file written by `advisor calibrate` or `advisor train`?")
    return records


def _record_problem(rec: dict) -> str | None:
    """What makes a record unusable, or None. Only the fields labelling reads are checked."""
    if not isinstance(rec.get("model"), dict):
        return "'model' must be an object"
    n = rec["model"].get("n_params")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        return "'model.n_params' must be a whole number"
    if not isinstance(rec.get("strategy"), str):
        return "'strategy' must be text"
    for key in ("features", "pool", "settings", "unit"):
        if rec.get(key) is not None and not isinstance(rec[key], dict):
            return f"'{key}' must be an object"
    evals = rec.get("evals")
    if not isinstance(evals, list) or not all(isinstance(e, dict) for e in evals):
        return "'evals' must be a list of objects"
    for e in evals:
        if not isinstance(e.get("epoch"), (int, float)) or isinstance(e.get("epoch"), bool):
            return "every eval needs a numeric 'epoch'"
        acc = e.get("accuracy")
        if acc is not None and (not isinstance(acc, (int, float)) or isinstance(acc, bool)):
            return "an eval's 'accuracy' must be a number or null"
    return None


def _unit(rec: dict) -> dict:
    """task / ranking / student / seed of a record (calibration records carry them; others are derived)."""
    if isinstance(rec.get("unit"), dict):
        u = rec["unit"]
        # a pool source is a task and the teacher that wrote its candidates
        task = u.get("task") if u.get("teacher", "lab:teacher") == "lab:teacher" else f"{u.get('task')}/{u.get('teacher')}"
        return {"task": task, "score": u.get("score"), "student": f"lab:{u.get('size')}", "seed": u.get("seed")}
    m, pool = rec.get("model") or {}, rec.get("pool") or {}
    return {"task": pool.get("task") or pool.get("fingerprint") or pool.get("source"), "score": pool.get("score", "sum"),
            "student": m.get("spec") or m.get("fingerprint"), "seed": (rec.get("settings") or {}).get("seed", 0)}


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


def label_rows(records: Iterable[dict], budgets: Sequence[float] = BUDGETS, tie_margin: float = 0.01) -> list[dict]:
    """One row per (task, ranking, student, seed, budget) that has both a high and a low run.

    The label is the best option at the budget; near-ties (within `tie_margin`) go to the cheaper,
    steadier option (`training.manifest.option_order`: high, mixes, curricula, low)."""
    groups: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for rec in records:
        option = record_option(rec)
        if option and isinstance(rec.get("evals"), list):
            u = _unit(rec)
            groups[(u["task"], u["score"], u["student"], u["seed"])][option] = rec
    rows = []
    for (task, score, student, seed), runs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        if "high" not in runs or "low" not in runs:
            continue
        horizon = min(max(e["epoch"] for e in r["evals"]) for r in runs.values())
        first = runs["high"]
        model = first.get("model") or {}
        for budget in [b for b in budgets if b <= horizon + 1e-9]:
            accs = {s: best_up_to(r["evals"], budget) for s, r in runs.items()}
            if any(math.isnan(a) for a in accs.values()):
                continue
            best = max(accs.values())
            near = sorted((s for s in accs if accs[s] >= best - tie_margin), key=option_order)
            rows.append({
                "group": f"{task}|{score}|{student}|{seed}",
                "unit": f"{task}|{score}|{student}|{seed}",
                "student": student, "task": task, "score": score, "seed": seed,
                "n_params": model.get("n_params"),
                "shape": shape_of(model),
                "features": {**(first.get("features") or {}), "budget": float(budget),
                             "ranking_sum": float(score == "sum")},
                "accuracy": accs,
                "label": near[0],
                "tie": len(near) > 1,
            })
    return rows


def shape_of(model: dict) -> str:
    """balanced, deep-narrow or shallow-wide, from hidden size per layer (as the lab ladder defines them)."""
    h, n = model.get("hidden_size"), model.get("n_layers")
    if not h or not n:
        return "unknown"
    per_layer = h / n
    return "deep-narrow" if per_layer < 16 else "shallow-wide" if per_layer > 64 else "balanced"


def matrix(rows_or_features: Sequence[dict], features: Sequence[str]) -> np.ndarray:
    feats = [r["features"] if "features" in r else r for r in rows_or_features]
    return np.array([[_num(f.get(k)) for k in features] for f in feats], dtype=float)


def _num(v) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return float("nan")
    return x if math.isfinite(x) else float("nan")


# ---- members: one fitted model each -------------------------------------------------------------


def _logistic_fit(X: np.ndarray, y: np.ndarray, classes: tuple, C: float = 0.3) -> dict:
    from sklearn.linear_model import LogisticRegression

    Z, fill, mu, sd = _standardize(X)
    clf = LogisticRegression(C=C, max_iter=5000).fit(Z, y)
    coef = clf.coef_ if len(classes) > 2 else np.vstack([-clf.coef_[0] / 2, clf.coef_[0] / 2])
    icpt = clf.intercept_ if len(classes) > 2 else np.array([-clf.intercept_[0] / 2, clf.intercept_[0] / 2])
    return {"kind": "logistic", "classes": list(classes), "fill": fill.tolist(), "mean": mu.tolist(),
            "scale": sd.tolist(), "coef": coef.tolist(), "intercept": icpt.tolist()}


def _lightgbm_params(classes: tuple, seed: int) -> dict:
    params = {"objective": "multiclass" if len(classes) > 2 else "binary", "num_leaves": 4, "min_data_in_leaf": 5,
              "learning_rate": 0.1, "lambda_l2": 1.0, "feature_fraction": 0.8, "min_data_in_bin": 1, "verbose": -1,
              "seed": seed, "deterministic": True, "num_threads": 1}
    if len(classes) > 2:
        params["num_class"] = len(classes)
    return params


def _lightgbm_fit(X: np.ndarray, y: np.ndarray, classes: tuple, seed: int) -> dict:
    import lightgbm as lgb

    booster = lgb.train(_lightgbm_params(classes, seed), lgb.Dataset(X, y), num_boost_round=60)
    return {"kind": "lightgbm", "classes": list(classes), "trees": [_tree_arrays(t["tree_structure"])
                                                                      for t in booster.dump_model()["tree_info"]]}


def _tree_arrays(root: dict) -> dict:
    """A LightGBM tree (its JSON dump) as flat arrays, children always after their parent."""
    t = {k: [] for k in ("feature", "threshold", "left", "right", "default_left", "nan_as", "value")}

    def add(node: dict) -> int:
        i = len(t["feature"])
        for k in t:
            t[k].append(0)
        if "leaf_value" in node or "split_feature" not in node:
            t["feature"][i], t["value"][i], t["left"][i], t["right"][i] = -1, float(node.get("leaf_value", 0.0)), -1, -1
            return i
        if node.get("decision_type", "<=") != "<=":
            raise ValueError("categorical splits are not used by this predictor")
        t["feature"][i] = int(node["split_feature"])
        t["threshold"][i] = float(node["threshold"])
        t["default_left"][i] = int(bool(node.get("default_left", True)))
        # how a missing value is routed: NaN -> default side; None -> treated as 0.0; Zero -> 0 and NaN default side
        t["nan_as"][i] = {"NaN": 0, "None": 1, "Zero": 2}.get(node.get("missing_type", "None"), 1)
        t["left"][i] = add(node["left_child"])
        t["right"][i] = add(node["right_child"])
        return i

    add(root)
    return t


def _tree_predict(t: dict, X: np.ndarray) -> np.ndarray:
    node = np.zeros(len(X), dtype=int)
    feature = np.asarray(t["feature"])
    for _ in range(len(feature)):  # each step moves every row to a later node, so this ends
        inner = feature[node] >= 0
        if not inner.any():
            break
        rows = np.nonzero(inner)[0]
        n = node[rows]
        x = X[rows, feature[n]]
        nan_as = np.asarray(t["nan_as"])[n]
        missing = np.isnan(x) | ((nan_as == 2) & (x == 0))
        x = np.where(np.isnan(x) & (nan_as == 1), 0.0, x)
        missing &= nan_as != 1
        go_left = np.where(missing, np.asarray(t["default_left"])[n] == 1, x <= np.asarray(t["threshold"])[n])
        node[rows] = np.where(go_left, np.asarray(t["left"])[n], np.asarray(t["right"])[n])
    return np.asarray(t["value"], dtype=float)[node]


def member_proba(m: dict, X: np.ndarray, options: Sequence[str] = SETS) -> np.ndarray:
    """Probabilities over `options` (columns) for one member; options it never saw get 0."""
    k = len(m["classes"])
    if m["kind"] == "logistic":
        z = _standardized(m, X)
        logits = z @ np.array(m["coef"]).T + np.array(m["intercept"])
    elif m["kind"] == "lightgbm":
        raw = np.zeros((len(X), k if k > 2 else 1))
        for i, t in enumerate(m["trees"]):
            raw[:, i % raw.shape[1]] += _tree_predict(t, X)
        logits = raw if k > 2 else np.hstack([np.zeros_like(raw), raw])
    elif m["kind"] == "ridge":
        z = _standardized(m, X)
        budget = np.where(np.isnan(X[:, m["budget_index"]]), 0.0, X[:, m["budget_index"]])
        gaps = _with_budget(z, budget) @ np.array(m["coef"]).T + np.array(m["intercept"]) - m["margin"]
        logits = np.hstack([np.zeros((len(X), 1)), gaps]) / m["spread"]
    elif m["kind"] == "constant":
        logits = np.tile(np.log(np.clip(np.array(m["proba"]), 1e-9, 1)), (len(X), 1))
    else:
        raise InputError(f"unknown member kind {m['kind']!r}")
    logits = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    p = e / e.sum(axis=1, keepdims=True)
    out = np.zeros((len(X), len(options)))
    for j, c in enumerate(m["classes"]):
        out[:, list(options).index(c)] = p[:, j]
    return out


def _standardized(m: dict, X: np.ndarray) -> np.ndarray:
    """X as a fitted member saw it: NaN inputs filled as in fitting, then z-scored (see _standardize)."""
    return (np.where(np.isnan(X), np.array(m["fill"]), X) - np.array(m["mean"])) / np.array(m["scale"])


def _standardize(X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(standardized X, fill, mean, scale): NaN inputs take the column median, then z-scores."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column is filled with 0
        fill = np.nanmedian(X, axis=0)
    fill = np.where(np.isnan(fill), 0.0, fill)
    Xf = np.where(np.isnan(X), fill, X)
    mu, sd = Xf.mean(axis=0), Xf.std(axis=0)
    sd = np.where(sd < 1e-12, 1.0, sd)
    return (Xf - mu) / sd, fill, mu, sd


RIDGE_MARGIN = 0.005  # accuracy a set must be predicted to gain over D_high before it is preferred


def _with_budget(Z: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """Each standardized input, and the same input times the budget: whether a set pays off
    depends on how long training runs, and a linear model sees that only through products."""
    return np.hstack([Z, Z * budget[:, None]])


def _ridge_fit(X: np.ndarray, rows: Sequence[dict], features: Sequence[str], alpha: float = 10.0) -> dict:
    """Regress each set's accuracy gap over D_high; probabilities are a softmax of the predicted
    gaps (minus RIDGE_MARGIN) over the residual spread, so they say how sure the gap is."""
    from sklearn.linear_model import Ridge

    others = [s for s in options_in(rows) if s != "high" and all(s in r["accuracy"] for r in rows)]
    Y = np.array([[r["accuracy"][s] - r["accuracy"]["high"] for s in others] for r in rows])
    Z, fill, mu, sd = _standardize(X)
    j = list(features).index("budget")
    A = _with_budget(Z, X[:, j])
    reg = Ridge(alpha=alpha).fit(A, Y)
    spread = float(max(0.005, np.sqrt(np.mean((reg.predict(A) - Y) ** 2))))
    return {"kind": "ridge", "classes": ["high", *others], "fill": fill.tolist(), "mean": mu.tolist(),
            "scale": sd.tolist(), "budget_index": j, "coef": np.atleast_2d(reg.coef_).tolist(),
            "intercept": np.atleast_1d(reg.intercept_).tolist(), "spread": spread, "margin": RIDGE_MARGIN}


def fit_member(rows: Sequence[dict], kind: str, features: Sequence[str], seed: int = 0) -> dict:
    labels = [r["label"] for r in rows]
    classes = tuple(sorted(set(labels), key=option_order)) or ("high",)
    X = matrix(rows, features)
    if kind == "ridge":
        return _ridge_fit(X, rows, features)
    if len(classes) < 2:
        return {"kind": "constant", "classes": list(classes), "proba": [1.0]}
    y = np.array([classes.index(lab) for lab in labels])
    if kind == "logistic":
        return _logistic_fit(X, y, classes)
    if kind == "lightgbm":
        return _lightgbm_fit(X, y, classes, seed)
    raise InputError(f"unknown predictor kind {kind!r}: use {' or '.join(KINDS)}")


# ---- the ensemble ------------------------------------------------------------------------------


def _bootstrap(rows: Sequence[dict], seed: int) -> list[dict]:
    """Rows of a resample of whole units (drawn with replacement), so a member never sees half a unit."""
    units = sorted({r["unit"] for r in rows})
    rng = np.random.default_rng(seed)
    by = defaultdict(list)
    for r in rows:
        by[r["unit"]].append(r)
    return [r for u in rng.choice(units, size=len(units), replace=True) for r in by[u]]


def fit_members(rows: Sequence[dict], kind: str, features: Sequence[str], n_members: int = 24, seed: int = 0,
                jobs: int = 1) -> list[dict]:
    from joblib import Parallel, delayed

    samples = [list(rows)] + [_bootstrap(rows, seed * 1000 + b) for b in range(1, n_members)]
    if jobs == 1:
        return [fit_member(s, kind, features, seed + b) for b, s in enumerate(samples)]
    return Parallel(n_jobs=jobs)(delayed(fit_member)(s, kind, features, seed + b) for b, s in enumerate(samples))


@dataclass
class Predictor:
    """An ensemble over `features` plus what it needs to judge a new student against its data."""

    features: tuple[str, ...]
    members: list[dict]
    kind: str = "logistic"
    options: tuple[str, ...] = SETS  # what it chooses among, in preference order
    range: dict = field(default_factory=dict)  # feature -> {min, max, mean, sd}
    units: list[dict] = field(default_factory=list)  # calibration units: name, z (standardized inputs), outcomes
    typical_distance: float = float("nan")  # 95th percentile of a unit's distance to its nearest other student
    meta: dict = field(default_factory=dict)

    def member_probas(self, rows_or_features: Sequence[dict]) -> np.ndarray:
        X = matrix(rows_or_features, self.features)
        return np.stack([member_proba(m, X, self.options) for m in self.members])  # (members, rows, options)

    def predict_proba(self, rows_or_features: Sequence[dict]) -> np.ndarray:
        return self.member_probas(rows_or_features).mean(axis=0)

    def predict(self, rows_or_features: Sequence[dict]) -> list[str]:
        return [self.options[i] for i in self.predict_proba(rows_or_features).argmax(axis=1)]

    def interval(self, features: dict, lo: float = 10, hi: float = 90) -> dict:
        """Per strategy, the members' lo-th and hi-th percentile of its probability."""
        p = self.member_probas([features])[:, 0, :]
        return {s: (float(np.percentile(p[:, j], lo)), float(np.percentile(p[:, j], hi))) for j, s in enumerate(self.options)}

    # ---- where the student sits among the calibrated ones --------------------------------------
    def _z(self, features: dict) -> np.ndarray:
        keys = [k for k in self.features if k not in ("budget", "ranking_sum")]
        nan = {"mean": float("nan"), "sd": 1.0}  # an input the calibration never measured
        return np.array([(_num(features.get(k)) - self.range.get(k, nan)["mean"]) / self.range.get(k, nan)["sd"]
                         for k in keys])

    def range_check(self, features: dict, slack: float = 0.1) -> list[dict]:
        """Per input: its value, the calibrated [min, max], and whether the value lies inside
        (with `slack` times the range on each side)."""
        out = []
        for k in self.features:
            r = self.range.get(k)
            v = _num(features.get(k))
            if r is None:
                continue
            width = max(r["max"] - r["min"], 1e-12)
            inside = None if math.isnan(v) else (r["min"] - slack * width <= v <= r["max"] + slack * width)
            out.append({"feature": k, "value": None if math.isnan(v) else v, "min": r["min"], "max": r["max"],
                        "inside": inside})
        return out

    def neighbours(self, features: dict, k: int = 3) -> list[dict]:
        """The calibrated units nearest to this student in standardized probe measurements."""
        if not self.units:
            return []
        z = self._z(features)
        out = []
        for u in self.units:
            d = _distance(z, np.array(u["z"], dtype=float))
            out.append({**{kk: v for kk, v in u.items() if kk != "z"}, "distance": d})
        out.sort(key=lambda u: u["distance"])
        return out[:k]

    def advise(self, features: dict) -> dict:
        """Probabilities, interval, range check, neighbours, and a confidence with its reasons."""
        p = self.predict_proba([features])[0]
        probs = {s: float(v) for s, v in zip(self.options, p)}
        choice = max(probs, key=probs.get)
        interval = self.interval(features)
        checks = self.range_check(features)
        outside = [c for c in checks if c["inside"] is False]
        near = self.neighbours(features)
        far = bool(near) and math.isfinite(self.typical_distance) and near[0]["distance"] > self.typical_distance
        others_hi = max(interval[s][1] for s in self.options if s != choice)
        words = []
        if outside:
            confidence = "low"
            words.append("outside the calibrated range on " + ", ".join(
                f"{c['feature']} = {c['value']:.3g} (calibrated {c['min']:.3g} to {c['max']:.3g})" for c in outside[:4]))
        elif far:
            confidence = "low"
            words.append(f"inside every input's range, but far from every calibrated student (distance "
                         f"{near[0]['distance']:.2f} > {self.typical_distance:.2f}, the 95th percentile among them)")
        elif interval[choice][0] > others_hi:
            confidence = "high"
            words.append(f"the ensemble's 10-90% interval for D_{choice} ({interval[choice][0]:.2f}-{interval[choice][1]:.2f}) "
                         f"lies above every other choice's")
        else:
            confidence = "medium"
            words.append(f"inside the calibrated data, but the ensemble's intervals overlap "
                         f"(D_{choice} {interval[choice][0]:.2f}-{interval[choice][1]:.2f}, others up to {others_hi:.2f})")
        return {"strategy": choice, "probabilities": probs, "interval": interval, "confidence": confidence,
                "confidence_reasons": words, "range": checks, "neighbours": near}

    def reasons(self, features: dict, k: int = 3) -> list[dict]:
        """The inputs that moved the chosen strategy's probability most, by replacing each with its
        calibrated mean (an occlusion measure that works for every member kind)."""
        choice = self.options.index(self.predict([features])[0])
        base = self.predict_proba([features])[0][choice]
        out = []
        for key in self.features:
            if key not in self.range:
                continue
            p = self.predict_proba([{**features, key: self.range[key]["mean"]}])[0][choice]
            out.append({"feature": key, "value": _num(features.get(key)), "weight": float(base - p),
                        "toward": self.options[choice] if base >= p else f"not {self.options[choice]}"})
        out.sort(key=lambda r: -abs(r["weight"]))
        return [r for r in out[:k] if abs(r["weight"]) > 1e-6]

    # ---- persistence -----------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": FORMAT, "kind": self.kind, "features": list(self.features), "options": list(self.options),
                "members": self.members,
                "range": self.range, "units": finite(self.units), "typical_distance": _json_num(self.typical_distance),
                "meta": finite(self.meta)}

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        body = self.to_dict()
        blob = json.dumps(body, sort_keys=True, allow_nan=False)
        path = folder / "predictor.json"
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps({"sha256": hashlib.sha256(blob.encode()).hexdigest(), **body}, indent=1,
                                      allow_nan=False) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, folder: str | Path) -> "Predictor":
        path = Path(folder) / "predictor.json"
        if not path.is_file():
            raise InputError(f"no predictor at {folder} (predictor.json missing): run `advisor fit` or drop --predictor")
        if path.stat().st_size > MAX_FILE_BYTES:
            raise InputError(f"predictor file {path} is {path.stat().st_size:,} bytes, more than any predictor needs; refit it")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise InputError(f"predictor file {path} is damaged ({type(e).__name__}); refit it with `advisor fit`") from None
        return cls.from_dict(raw, str(path))

    @classmethod
    def from_dict(cls, raw: dict, where: str = "predictor") -> "Predictor":
        def bad(why: str) -> InputError:
            return InputError(f"predictor file {where} is damaged ({why}); refit it with `advisor fit`")

        if not isinstance(raw, dict):
            raise bad("not a JSON object")
        if raw.get("format") != FORMAT:
            raise InputError(f"predictor {where} has format {raw.get('format')!r}, this version reads {FORMAT}; refit it "
                             "with `advisor fit`")
        body = {k: v for k, v in raw.items() if k != "sha256"}
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode()).hexdigest()
        if raw.get("sha256") != digest:
            raise bad("its content does not match its sha256")
        feats = raw.get("features")
        if not (isinstance(feats, list) and feats and all(isinstance(f, str) for f in feats)):
            raise bad("features")
        options = raw.get("options", list(SETS))
        try:
            if not (isinstance(options, list) and options and all(isinstance(o, str) for o in options)):
                raise InputError("options")
            for o in options:
                schedule_of(o)
        except InputError:
            raise bad("options") from None
        members = raw.get("members")
        if not isinstance(members, list) or not members:
            raise bad("no members")
        for m in members:
            _check_member(m, len(feats), bad, options)
        rng = raw.get("range") or {}
        if not isinstance(rng, dict) or not all(
                isinstance(v, dict) and all(isinstance(v.get(k), (int, float)) for k in ("min", "max", "mean", "sd"))
                and v["sd"] > 0 for v in rng.values()):
            raise bad("range")
        units = raw.get("units") or []
        n_z = len([f for f in feats if f not in ("budget", "ranking_sum")])
        if not isinstance(units, list) or not all(
                isinstance(u, dict) and isinstance(u.get("z"), list) and len(u["z"]) == n_z
                and all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in u["z"])
                for u in units):
            raise bad("units")
        td = raw.get("typical_distance")
        return cls(tuple(feats), members, str(raw.get("kind", "")), tuple(options), rng, units,
                   float(td) if isinstance(td, (int, float)) else float("nan"),
                   raw.get("meta") if isinstance(raw.get("meta"), dict) else {})


def _check_member(m, n_features: int, bad, options: Sequence[str] = SETS) -> None:
    if not isinstance(m, dict) or m.get("kind") not in ("logistic", "lightgbm", "ridge", "constant"):
        raise bad("member kind")
    classes = m.get("classes")
    if not (isinstance(classes, list) and classes and len(set(classes)) == len(classes) and set(classes) <= set(options)):
        raise bad("member classes")
    k = len(classes)

    def arr(x, shape) -> bool:
        try:
            a = np.asarray(x, dtype=float)
        except (TypeError, ValueError):
            return False
        return a.shape == shape and bool(np.isfinite(a).all())

    if m["kind"] == "constant":
        if not arr(m.get("proba"), (k,)):
            raise bad("constant member")
    elif m["kind"] in ("logistic", "ridge"):
        ridge = m["kind"] == "ridge"
        rows, cols = (k - 1, 2 * n_features) if ridge else (k, n_features)
        if not (k >= 2 and all(arr(m.get(n), (n_features,)) for n in ("fill", "mean", "scale"))
                and arr(m.get("coef"), (rows, cols)) and arr(m.get("intercept"), (rows,))
                and np.all(np.asarray(m["scale"], dtype=float) > 0)):
            raise bad(f"{m['kind']} member")
        j = m.get("budget_index")
        if ridge and not (classes[0] == "high" and arr([m.get("spread"), m.get("margin")], (2,)) and m["spread"] > 0
                          and isinstance(j, int) and not isinstance(j, bool) and 0 <= j < n_features):
            raise bad("ridge member")
    else:
        trees = m.get("trees")
        if not isinstance(trees, list) or not trees or k < 2 or len(trees) % (k if k > 2 else 1):
            raise bad("tree count")
        for t in trees:
            if not isinstance(t, dict):
                raise bad("tree")
            n = len(t.get("feature") or [])
            if n == 0 or not all(isinstance(t.get(key), list) and len(t[key]) == n
                                 for key in ("threshold", "left", "right", "default_left", "nan_as", "value")):
                raise bad("tree arrays")
            if not (arr(t["threshold"], (n,)) and arr(t["value"], (n,))):
                raise bad("tree values")
            for i in range(n):
                f, lft, rgt = t["feature"][i], t["left"][i], t["right"][i]
                if not all(isinstance(v, int) and not isinstance(v, bool) for v in (f, lft, rgt)):
                    raise bad("tree indices")
                if f == -1:
                    continue
                if not (0 <= f < n_features and i < lft < n and i < rgt < n and t["nan_as"][i] in (0, 1, 2)
                        and t["default_left"][i] in (0, 1)):
                    raise bad("tree structure")


def _distance(a: np.ndarray, b: np.ndarray) -> float:
    """Root-mean-square difference over the inputs both have (NaN inputs are skipped)."""
    ok = ~(np.isnan(a) | np.isnan(b))
    return float(np.sqrt(np.mean((a[ok] - b[ok]) ** 2))) if ok.any() else float("inf")


def _json_num(x: float):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def fit_predictor(rows: Sequence[dict], kind: str = "logistic", features: Sequence[str] = PROBE_FEATURES,
                  n_members: int = 24, seed: int = 0, jobs: int = 1) -> Predictor:
    """The bagged ensemble with its calibrated range and the unit table for neighbours."""
    members = fit_members(rows, kind, features, n_members, seed, jobs)
    X = matrix(rows, features)
    options = options_in(rows)
    rng = {}
    for j, k in enumerate(features):
        col = X[:, j][~np.isnan(X[:, j])]
        if len(col):
            sd = float(col.std())
            rng[k] = {"min": float(col.min()), "max": float(col.max()), "mean": float(col.mean()),
                      "sd": sd if sd > 1e-12 else 1.0}
    pred = Predictor(tuple(features), members, kind, options, rng)
    by_unit: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_unit[r["unit"]].append(r)
    pred.units = []
    for u, rs in sorted(by_unit.items()):
        r0 = rs[0]
        pred.units.append({"unit": u, "student": r0["student"], "task": r0["task"], "score": r0["score"],
                           "seed": r0["seed"], "n_params": r0.get("n_params"),
                           "z": [_json_num(v) for v in pred._z(r0["features"])],
                           "outcomes": {f"{r['features']['budget']:g}": {"label": r["label"],
                                                                          **{s: round(a, 4) for s, a in r["accuracy"].items()}}
                                        for r in rs}})
    dists = []
    for u in pred.units:
        others = [_distance(np.array(u["z"], dtype=float), np.array(o["z"], dtype=float))
                  for o in pred.units if o["student"] != u["student"]]
        if others:
            dists.append(min(others))
    pred.typical_distance = float(np.percentile(dists, 95)) if dists else float("nan")
    return pred


# ---- baselines and evaluation ------------------------------------------------------------------


def regret(row: dict, choice: str) -> float:
    """Accuracy lost against the best strategy in hindsight (0..1); a strategy never run counts as the worst."""
    accs = row["accuracy"]
    return max(accs.values()) - accs.get(choice, min(accs.values()))


def is_right(row: dict, choice: str, tie_margin: float = 0.01) -> bool:
    return regret(row, choice) <= tie_margin + 1e-12


CONSTANTS = {"always high (GRAPE)": "high", "always low": "low", "always mixed": "mixed"}


@dataclass
class Rule:
    """The paper's rule of thumb made fair: low iff log10(params) ≥ t_p and budget ≥ t_e, fitted to minimise regret."""

    t_params: float
    t_budget: float

    @classmethod
    def fit(cls, rows: Sequence[dict]) -> "Rule":
        P = sorted({math.log10(r["n_params"]) for r in rows}) + [math.inf]
        E = sorted({r["features"]["budget"] for r in rows}) + [math.inf]
        best = None
        for tp in P:
            for te in E:
                rule = cls(tp, te)
                reg = mean(regret(r, rule.choose(r)) for r in rows)
                if best is None or reg < best[0] - 1e-12:
                    best = (reg, rule)
        return best[1]

    def choose(self, row: dict) -> str:
        return "low" if (math.log10(row["n_params"]) >= self.t_params and row["features"]["budget"] >= self.t_budget) else "high"


SPLITS = ("student", "shape", "task")


def folds(rows: Sequence[dict], split: str) -> list[tuple[str, list[dict], list[dict]]]:
    """(held-out name, train rows, test rows) for leave-one-student / -shape / -task -out."""
    if split == "student":
        key = lambda r: r["student"]  # noqa: E731
    elif split == "shape":
        key = lambda r: r["shape"]  # noqa: E731
    elif split == "task":
        key = lambda r: r["task"]  # noqa: E731
    else:
        raise InputError(f"unknown split {split!r}: use {', '.join(SPLITS)}")
    names = sorted({key(r) for r in rows})
    if split == "shape":  # the balanced ladder spans every size; holding it out leaves nothing to learn from
        names = [n for n in names if n not in ("balanced", "unknown")]
    out = []
    for name in names:
        train = [r for r in rows if key(r) != name]
        test = [r for r in rows if key(r) == name]
        if train and test and len({r["student"] for r in train}) >= 2:
            out.append((name, train, test))
    return out


def cross_validate(rows: Sequence[dict], split: str = "student", kinds: Sequence[str] = KINDS,
                   features: Sequence[str] = PROBE_FEATURES, n_members: int = 8, tie_margin: float = 0.01,
                   seed: int = 0, jobs: int = 1) -> dict:
    """Held-out choices of each model kind and baseline; per method: rows, accuracy, mean regret
    (points) with a bootstrap 90% interval over held-out groups, and per arm (ranking)."""
    fs = folds(rows, split)
    if not fs:
        raise InputError(f"records cover too few students/{split}s to hold one out (need at least 2 students)")
    picks: dict[str, list[tuple[dict, str]]] = defaultdict(list)
    for _, train, test in fs:
        for kind in kinds:
            model = Predictor(tuple(features), fit_members(train, kind, features, n_members, seed, jobs),
                              options=options_in(rows))
            picks[kind] += list(zip(test, model.predict(test)))
        rule = Rule.fit(train)
        picks["rule of thumb (fitted thresholds)"] += [(r, rule.choose(r)) for r in test]
        for name, s in CONSTANTS.items():
            picks[name] += [(r, s) for r in test]
    table = {}
    for name, pairs in picks.items():
        table[name] = summarize(pairs, tie_margin, seed)
    return {"split": split, "folds": [f[0] for f in fs], "methods": table}


def summarize(pairs: Sequence[tuple[dict, str]], tie_margin: float = 0.01, seed: int = 0) -> dict:
    regrets = np.array([100 * regret(r, s) for r, s in pairs])
    groups = np.array([r["group"] for r, _ in pairs])
    out = {"rows": len(pairs), "accuracy": float(np.mean([is_right(r, s, tie_margin) for r, s in pairs])),
           "mean_regret_points": float(regrets.mean()), "ci90": _group_bootstrap(regrets, groups, seed)}
    for arm in sorted({r["score"] for r, _ in pairs}):
        sub = [(r, s) for r, s in pairs if r["score"] == arm]
        out[f"arm_{arm}"] = {"rows": len(sub), "accuracy": float(np.mean([is_right(r, s, tie_margin) for r, s in sub])),
                             "mean_regret_points": float(np.mean([100 * regret(r, s) for r, s in sub]))}
    return out


def _group_bootstrap(values: np.ndarray, groups: np.ndarray, seed: int, n: int = 1000) -> list[float]:
    """90% interval of the mean, resampling whole groups (a student-pool-seed's budgets move together)."""
    names = np.unique(groups)
    idx = {g: np.nonzero(groups == g)[0] for g in names}
    rng = np.random.default_rng(seed)
    means = []
    for _ in range(n):
        take = np.concatenate([idx[g] for g in rng.choice(names, size=len(names), replace=True)])
        means.append(values[take].mean())
    return [float(np.percentile(means, 5)), float(np.percentile(means, 95))]


def permutation_importance(rows: Sequence[dict], kind: str, features: Sequence[str], n_members: int = 8,
                           seed: int = 0, repeats: int = 3) -> list[dict]:
    """Leave-one-student-out regret increase when one input is shuffled among the held-out rows."""
    rng = np.random.default_rng(seed)
    fs = folds(rows, "student")
    models = [(Predictor(tuple(features), fit_members(train, kind, features, n_members, seed), options=options_in(rows)), test)
              for _, train, test in fs]
    base = mean(regret(r, s) for m, test in models for r, s in zip(test, m.predict(test)))
    out = []
    for key in features:
        deltas = []
        for _ in range(repeats):
            total = []
            for m, test in models:
                vals = [r["features"].get(key) for r in test]
                perm = rng.permutation(len(vals))
                shuffled = [{**r["features"], key: vals[perm[i]]} for i, r in enumerate(test)]
                total += [regret(r, s) for r, s in zip(test, m.predict(shuffled))]
            deltas.append(mean(total) - base)
        out.append({"feature": key, "regret_increase_points": 100 * float(np.mean(deltas))})
    return sorted(out, key=lambda d: -d["regret_increase_points"])
