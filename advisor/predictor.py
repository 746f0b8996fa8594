"""The fitted predictor: probe features + parameter count + epoch budget -> high / low / mixed.

    rows = label_rows(read_records("records.jsonl"))
    table, best = cross_validate(rows)          # leave-one-student-out, against three baselines
    fit(rows, best).save("predictor/")
    Predictor.load("predictor/").predict_proba([{"log10_params": 6.1, "budget": 3, ...}])

Labels follow the paper's protocol: for a (student, pool, seed) and a budget of E epochs, each
strategy is worth its best checkpoint accuracy up to epoch E, and the label is the best strategy.
Near-ties (within `tie_margin` accuracy) are resolved toward the cheaper, steadier choice in the
order high > mixed > low, and flagged; in scoring, a choice within the margin of the best counts
as right and its regret is the (small) real gap.

Models are saved without pickle: LightGBM's own text format, or the logistic regression's
coefficients, with JSON metadata. Loading one never executes code.
"""

from __future__ import annotations

import json
import math
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Iterable, Sequence

import numpy as np

from models.errors import InputError
from models.files import atomic_path, read_jsonl, write_json

STRATEGIES = ("high", "low", "mixed")
TIE_ORDER = ("high", "mixed", "low")  # among near-ties, prefer fast-fit, then the hedge
FEATURES = (
    "log10_params", "budget",
    "likelihood_gap", "length_ratio_low_high",
    "high_teacher_nll_drop_rel", "low_teacher_nll_drop_rel", "teacher_nll_drop_ratio_low_high",
    "low_repetition_end", "repetition_end_gap_low_high",
    "high_accuracy_gain", "low_accuracy_gain", "accuracy_gain_gap_low_high",
    "drift_end_gap_low_high", "train_loss_end_ratio_low_high", "base_accuracy", "score_is_sum",
)
PRIOR_FEATURES = ("log10_params", "budget")
FORMAT = 1


# ---- records -> labelled rows ------------------------------------------------------------------


def read_records(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.exists():
        raise InputError(f"records file {path} does not exist: run `advisor calibrate` or `advisor train` first")
    try:
        return read_jsonl(p)
    except ValueError as e:
        raise InputError(f"{e}: remove the damaged line from the records file") from None


def group_key(rec: dict) -> str:
    m, pool = rec.get("model", {}), rec.get("pool", {}) or {}
    seed = (rec.get("settings") or {}).get("seed", rec.get("seed", 0))
    return f"{m.get('spec') or m.get('fingerprint')}|{pool.get('fingerprint', pool.get('source', ''))}|{seed}"


def best_up_to(evals: Sequence[dict], budget: float) -> float:
    accs = [e["accuracy"] for e in evals if e.get("accuracy") is not None and e["epoch"] <= budget + 1e-9]
    return max(accs) if accs else float("nan")


def label_rows(records: Iterable[dict], budgets: Sequence[float] | None = None, tie_margin: float = 0.01) -> list[dict]:
    """One row per (student, pool, seed, budget) that has both a high and a low run."""
    groups: dict[str, dict[str, dict]] = defaultdict(dict)
    for rec in records:
        if rec.get("strategy") in STRATEGIES:
            groups[group_key(rec)][rec["strategy"]] = rec
    rows = []
    for key, runs in groups.items():
        if "high" not in runs or "low" not in runs:
            continue
        horizon = min(max(e["epoch"] for e in r["evals"]) for r in runs.values())
        grid = budgets or [b for b in (0.5, 1, 2, 3, 4, 5, 6, 8, 10) if b <= horizon + 1e-9]
        first = runs["high"]
        for budget in grid:
            accs = {s: best_up_to(r["evals"], budget) for s, r in runs.items()}
            if any(math.isnan(a) for a in accs.values()):
                continue
            best = max(accs.values())
            near = [s for s in TIE_ORDER if s in accs and accs[s] >= best - tie_margin]
            rows.append({
                "group": key,
                "student": first["model"].get("spec") or first["model"].get("fingerprint"),
                "features": {**first.get("features", {}), "log10_params": math.log10(first["model"]["n_params"]),
                             "budget": float(budget)},
                "accuracy": accs,
                "label": near[0],
                "tie": len(near) > 1,
            })
    return rows


def matrix(rows: Sequence[dict], features: Sequence[str]) -> np.ndarray:
    return np.array([[_num(r["features"].get(f)) for f in features] for r in rows], dtype=float)


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


# ---- models ------------------------------------------------------------------------------------


@dataclass
class Predictor:
    """A fitted model; `predict_proba` returns columns in STRATEGIES order."""

    kind: str  # lightgbm | logistic | rule | constant
    features: tuple[str, ...]
    classes: tuple[str, ...]
    state: dict = field(default_factory=dict)
    booster: object = None
    meta: dict = field(default_factory=dict)

    def predict_proba(self, rows_or_features: Sequence[dict]) -> np.ndarray:
        feats = [r["features"] if "features" in r else r for r in rows_or_features]
        X = np.array([[_num(f.get(k)) for k in self.features] for f in feats], dtype=float)
        if self.kind == "lightgbm":
            p = np.asarray(self.booster.predict(X))
            if p.ndim == 1:  # binary objective: probability of classes[1]
                p = np.stack([1 - p, p], axis=1)
        elif self.kind == "logistic":
            p = _logistic_proba(self.state, X)
        elif self.kind == "rule":
            low = (X[:, 0] >= self.state["log10_params"]) & (X[:, 1] >= self.state["budget"])
            p = np.stack([~low, low], axis=1).astype(float)
        else:
            p = np.tile(np.array(self.state["proba"]), (len(X), 1))
        out = np.zeros((len(X), len(STRATEGIES)))
        for j, c in enumerate(self.classes):
            out[:, STRATEGIES.index(c)] = p[:, j]
        return out

    def predict(self, rows: Sequence[dict]) -> list[str]:
        return [STRATEGIES[i] for i in self.predict_proba(rows).argmax(axis=1)]

    def reasons(self, features: dict, k: int = 3) -> list[dict]:
        """The features that pushed this prediction most, with their values and signed weight."""
        X = np.array([[_num(features.get(f)) for f in self.features]])
        cls = self.predict([features])[0]
        if self.kind == "lightgbm":
            contrib = np.asarray(self.booster.predict(X, pred_contrib=True))[0]
            n = len(self.features) + 1
            if len(self.classes) > 2:
                contrib = contrib[self.classes.index(cls) * n:(self.classes.index(cls) + 1) * n]
            elif cls == self.classes[0]:
                contrib = -contrib
            weights = contrib[:-1]
        elif self.kind == "logistic":
            s = self.state
            z = (np.where(np.isnan(X), np.array(s["fill"]), X) - np.array(s["mean"])) / np.array(s["scale"])
            coef = np.array(s["coef"])
            if coef.shape[0] == 1:
                coef = np.vstack([-coef[0], coef[0]])
            weights = (coef[self.classes.index(cls)] * z[0])
        else:
            weights = np.zeros(len(self.features))
        order = np.argsort(-np.abs(weights))[:k]
        return [{"feature": self.features[i], "value": _num(features.get(self.features[i])),
                 "weight": float(weights[i]), "toward": cls if weights[i] > 0 else f"not {cls}"} for i in order
                if weights[i] != 0]

    # ---- persistence -----------------------------------------------------------------------
    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        meta = {"format": FORMAT, "kind": self.kind, "features": list(self.features), "classes": list(self.classes),
                "state": self.state, **self.meta}
        if self.kind == "lightgbm":
            with atomic_path(folder / "model.txt") as tmp:
                self.booster.save_model(str(tmp))
        write_json(folder / "predictor.json", meta)

    @classmethod
    def load(cls, folder: str | Path) -> "Predictor":
        folder = Path(folder)
        path = folder / "predictor.json"
        if not path.exists():
            raise InputError(f"no predictor at {folder} (predictor.json missing): run `advisor fit` or drop --predictor")
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
            kind, features, classes = meta["kind"], tuple(meta["features"]), tuple(meta["classes"])
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise InputError(f"predictor file {path} is damaged ({type(e).__name__}); refit it with `advisor fit`") from None
        if meta.get("format") != FORMAT:
            raise InputError(f"predictor {path} has format {meta.get('format')}, this version reads {FORMAT}; refit it")
        if kind not in ("lightgbm", "logistic", "rule", "constant") or not set(classes) <= set(STRATEGIES):
            raise InputError(f"predictor file {path} is damaged (kind {kind!r}, classes {classes}); refit it")
        booster = None
        if kind == "lightgbm":
            import lightgbm as lgb

            try:
                booster = lgb.Booster(model_file=str(folder / "model.txt"))
            except Exception as e:  # LightGBM raises its own error type on a bad file
                raise InputError(f"predictor model {folder / 'model.txt'} is damaged: {str(e).splitlines()[0][:120]}") from None
            if booster.num_feature() != len(features):
                raise InputError(f"predictor model {folder / 'model.txt'} does not match predictor.json; refit it")
        rest = {k: v for k, v in meta.items() if k not in ("format", "kind", "features", "classes", "state")}
        return cls(kind, features, classes, meta.get("state", {}), booster, rest)


def _logistic_proba(state: dict, X: np.ndarray) -> np.ndarray:
    z = (np.where(np.isnan(X), np.array(state["fill"]), X) - np.array(state["mean"])) / np.array(state["scale"])
    logits = z @ np.array(state["coef"]).T + np.array(state["intercept"])
    if logits.shape[1] == 1:  # binary: sklearn keeps one row of coefficients for classes[1]
        logits = np.hstack([np.zeros_like(logits), logits])
    logits -= logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=1, keepdims=True)


def fit(rows: Sequence[dict], kind: str, features: Sequence[str] = FEATURES, seed: int = 0) -> Predictor:
    labels = [r["label"] for r in rows]
    classes = tuple(c for c in STRATEGIES if c in labels)
    if len(classes) < 2:
        proba = [1.0 if c == (classes or ("high",))[0] else 0.0 for c in (classes or ("high",))]
        return Predictor("constant", tuple(features), classes or ("high",), {"proba": proba})
    y = np.array([classes.index(lab) for lab in labels])
    if kind == "rule":
        return _fit_rule(rows)
    X = matrix(rows, features)
    if kind == "lightgbm":
        import lightgbm as lgb

        params = {"objective": "multiclass" if len(classes) > 2 else "binary", "num_leaves": 4, "min_data_in_leaf": 3,
                  "learning_rate": 0.1, "lambda_l2": 1.0, "feature_fraction": 0.8, "bagging_fraction": 0.8,
                  "bagging_freq": 1, "min_data_in_bin": 1, "verbose": -1, "seed": seed, "deterministic": True,
                  "num_threads": 1}
        if len(classes) > 2:
            params["num_class"] = len(classes)
        booster = lgb.train(params, lgb.Dataset(X, y, feature_name=[f.replace(" ", "_") for f in features]),
                            num_boost_round=60)
        return Predictor("lightgbm", tuple(features), classes, {}, booster)
    if kind == "logistic":
        from sklearn.linear_model import LogisticRegression

        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column is filled with 0
            fill = np.nanmedian(np.where(np.isfinite(X), X, np.nan), axis=0)
        fill = np.where(np.isnan(fill), 0.0, fill)
        Xf = np.where(np.isfinite(X), X, fill)
        mu, sd = Xf.mean(axis=0), Xf.std(axis=0)
        sd = np.where(sd < 1e-12, 1.0, sd)
        clf = LogisticRegression(C=0.5, max_iter=2000).fit((Xf - mu) / sd, y)
        state = {"fill": fill.tolist(), "mean": mu.tolist(), "scale": sd.tolist(), "coef": clf.coef_.tolist(),
                 "intercept": clf.intercept_.tolist()}
        return Predictor("logistic", tuple(features), classes, state)
    raise InputError(f"unknown predictor kind {kind!r}: use lightgbm, logistic or rule")


def _fit_rule(rows: Sequence[dict]) -> Predictor:
    """The paper's rule of thumb made fair: low iff log-params ≥ t_p and budget ≥ t_e, thresholds chosen to minimise regret."""
    P = sorted({r["features"]["log10_params"] for r in rows}) + [math.inf]
    E = sorted({r["features"]["budget"] for r in rows}) + [math.inf]
    best = None
    for tp in P:
        for te in E:
            pick = ["low" if r["features"]["log10_params"] >= tp and r["features"]["budget"] >= te else "high" for r in rows]
            reg = mean(regret(r, s) for r, s in zip(rows, pick))
            if best is None or reg < best[0] - 1e-12:
                best = (reg, tp, te)
    _, tp, te = best
    return Predictor("rule", PRIOR_FEATURES, ("high", "low"), {"log10_params": tp, "budget": te})


# ---- evaluation --------------------------------------------------------------------------------


def regret(row: dict, choice: str) -> float:
    """Accuracy lost against the best strategy in hindsight (0..1); a strategy never run counts as the worst."""
    accs = row["accuracy"]
    return max(accs.values()) - accs.get(choice, min(accs.values()))


def is_right(row: dict, choice: str, tie_margin: float = 0.01) -> bool:
    return regret(row, choice) <= tie_margin + 1e-12


BASELINES = {"always high (GRAPE)": "high", "always low (hardest)": "low"}
MODELS = ("lightgbm", "logistic")


def cross_validate(rows: Sequence[dict], tie_margin: float = 0.01) -> tuple[list[dict], str]:
    """Leave-one-student-out: accuracy and mean regret of each model and baseline; returns (table, best model)."""
    students = sorted({r["student"] for r in rows})
    if len(students) < 2:
        raise InputError(f"records cover {len(students)} student(s); leave-one-student-out needs at least 2")
    picks: dict[str, list[tuple[dict, str]]] = defaultdict(list)
    for held in students:
        train = [r for r in rows if r["student"] != held]
        test = [r for r in rows if r["student"] == held]
        for kind in MODELS:
            picks[kind] += list(zip(test, fit(train, kind).predict(test)))
        picks["rule of thumb (fitted thresholds)"] += list(zip(test, _fit_rule(train).predict(test)))
        for name, s in BASELINES.items():
            picks[name] += [(r, s) for r in test]
    table = []
    for name, pairs in picks.items():
        table.append({"method": name, "rows": len(pairs),
                      "accuracy": mean(is_right(r, s, tie_margin) for r, s in pairs),
                      "mean_regret_points": 100 * mean(regret(r, s) for r, s in pairs)})
    best = min((t for t in table if t["method"] in MODELS), key=lambda t: (t["mean_regret_points"], -t["accuracy"]))
    return table, best["method"]


def fit_and_save(records: Sequence[dict], out: str | Path, tie_margin: float = 0.01) -> dict:
    """Cross-validate, refit the better model on every row, and save it with a prior and the rule of thumb.

    OUT/predictor.json (+ model.txt for LightGBM) is the predictor `recommend` uses; OUT/prior/ is
    the parameter-count-and-budget model behind `--no-probe`.
    """
    rows = label_rows(records, tie_margin=tie_margin)
    if not rows:
        raise InputError("the records hold no (student, pool) with both a high and a low run: nothing to learn from")
    table, best = cross_validate(rows, tie_margin)
    model = fit(rows, best)
    rule = _fit_rule(rows)
    model.meta = {
        "cv": table,
        "chosen_by": "leave-one-student-out mean regret",
        "rows": len(rows),
        "records": len(records),
        "students": sorted({r["student"] for r in rows}),
        "labels": {s: sum(r["label"] == s for r in rows) for s in STRATEGIES},
        "ties": sum(r["tie"] for r in rows),
        "tie_margin": tie_margin,
        "rule_of_thumb": rule.state,
    }
    model.save(out)
    prior = fit(rows, "logistic", features=PRIOR_FEATURES)
    prior.meta = {"note": "parameter count and budget only (advisor recommend --no-probe)"}
    prior.save(Path(out) / "prior")
    return {"cv": table, "chosen": best, "rows": len(rows), "labels": model.meta["labels"], "ties": model.meta["ties"],
            "rule_of_thumb": rule.state, "out": str(out)}
