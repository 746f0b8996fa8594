"""Ensemble members: one fitted model each, of one of a few kinds, stored as plain JSON.

`KINDS` is the one table of kinds: for each, how it is fitted, how it turns inputs into logits,
and how a member read from a file is checked. Kinds that a user may fit (`FITTABLE`):

- `logistic`: multinomial logistic regression on standardized inputs (NaN -> the column median);
- `lightgbm`: gradient-boosted trees (LightGBM), stored as arrays and evaluated in numpy;
- `ridge`: a ridge regression of each set's accuracy gap over D_high on the standardized inputs
  and their products with the budget; probabilities are a softmax of the predicted gaps over the
  residual spread;
- `curve`: the same gap regression with the budget entering as log(1 + epochs), the shape of a
  learning curve, and a stronger penalty: few parameters that extrapolate the probe's contrasts
  smoothly in the budget.

`constant` members stand in when a bootstrap resample holds one label only.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from capacity_advisor.core.numbers import number, whole
from capacity_advisor.advisor.predictor.forest import Forest, check_trees, tree_arrays
from capacity_advisor.advisor.predictor.labels import matrix, options_in
from capacity_advisor.core.errors import InputError
from capacity_advisor.training.manifest import SETS, option_order

RIDGE_MARGIN = 0.005  # accuracy a set must be predicted to gain over D_high before it is preferred


def _standardize(X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(standardized X, fill, mean, scale): NaN inputs take the column median, then z-scores."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column is filled with 0
        fill = np.nanmedian(X, axis=0) if len(X) else np.zeros(X.shape[1])
    fill = np.where(np.isnan(fill), 0.0, fill)
    Xf = np.where(np.isnan(X), fill, X)
    mu, sd = Xf.mean(axis=0), Xf.std(axis=0)
    sd = np.where(sd < 1e-12, 1.0, sd)
    return (Xf - mu) / sd, fill, mu, sd


def _standardized(m: dict, X: np.ndarray) -> np.ndarray:
    """X as a fitted member saw it: NaN inputs filled as in fitting, then z-scored."""
    return (np.where(np.isnan(X), np.array(m["fill"]), X) - np.array(m["mean"])) / np.array(m["scale"])


# ---- logistic ----------------------------------------------------------------------------------


def _logistic_fit(X, y, classes, rows, features, seed, C: float = 0.3) -> dict:
    from sklearn.linear_model import LogisticRegression

    Z, fill, mu, sd = _standardize(X)
    clf = LogisticRegression(C=C, max_iter=5000).fit(Z, y)
    coef = clf.coef_ if len(classes) > 2 else np.vstack([-clf.coef_[0] / 2, clf.coef_[0] / 2])
    icpt = clf.intercept_ if len(classes) > 2 else np.array([-clf.intercept_[0] / 2, clf.intercept_[0] / 2])
    return {"kind": "logistic", "classes": list(classes), "fill": fill.tolist(), "mean": mu.tolist(),
            "scale": sd.tolist(), "coef": coef.tolist(), "intercept": icpt.tolist()}


def _logistic_logits(m: dict, X: np.ndarray) -> np.ndarray:
    return _standardized(m, X) @ np.array(m["coef"]).T + np.array(m["intercept"])


# ---- lightgbm ----------------------------------------------------------------------------------


def lightgbm_params(classes: tuple, seed: int) -> dict:
    params = {"objective": "multiclass" if len(classes) > 2 else "binary", "num_leaves": 4, "min_data_in_leaf": 5,
              "learning_rate": 0.1, "lambda_l2": 1.0, "feature_fraction": 0.8, "min_data_in_bin": 1, "verbose": -1,
              "seed": seed, "deterministic": True, "num_threads": 1}
    if len(classes) > 2:
        params["num_class"] = len(classes)
    return params


def _lightgbm_fit(X, y, classes, rows, features, seed) -> dict:
    import lightgbm as lgb

    booster = lgb.train(lightgbm_params(classes, seed), lgb.Dataset(X, y), num_boost_round=60)
    return {"kind": "lightgbm", "classes": list(classes),
            "trees": [tree_arrays(t["tree_structure"]) for t in booster.dump_model()["tree_info"]]}


_FORESTS: "OrderedDict[int, tuple[dict, Forest]]" = OrderedDict()


def _forest(m: dict) -> Forest:
    """The member's trees stacked once (kept for the last few hundred members evaluated)."""
    hit = _FORESTS.get(id(m))
    if hit is not None and hit[0] is m:
        _FORESTS.move_to_end(id(m))
        return hit[1]
    f = Forest(m["trees"])
    _FORESTS[id(m)] = (m, f)
    while len(_FORESTS) > 512:
        _FORESTS.popitem(last=False)
    return f


def _lightgbm_logits(m: dict, X: np.ndarray) -> np.ndarray:
    k = len(m["classes"])
    per_round = k if k > 2 else 1
    values = _forest(m).raw(X)  # (trees, rows); tree i adds to class i % per_round
    raw = np.stack([values[c::per_round].sum(axis=0) for c in range(per_round)], axis=1)
    return raw if k > 2 else np.hstack([np.zeros_like(raw), raw])


# ---- gap regressions: ridge (budget products) and curve (log budget) ---------------------------


def _budget_terms(Z: np.ndarray, budget: np.ndarray, transform: str) -> np.ndarray:
    """Each standardized input and the same input times the budget term; the curve also gets the
    budget term itself. Whether a set pays off depends on how long training runs, and a linear
    model sees that only through products."""
    if transform == "log1p":
        b = np.log1p(np.clip(budget, 0, None))[:, None]
        return np.hstack([Z, Z * b, b])
    return np.hstack([Z, Z * budget[:, None]])


def _gap_fit(X, rows, features, kind: str, alpha: float, transform: str) -> dict:
    from sklearn.linear_model import Ridge

    others = [s for s in options_in(rows) if s != "high" and all(s in r["accuracy"] for r in rows)]
    Y = np.array([[r["accuracy"][s] - r["accuracy"]["high"] for s in others] for r in rows]).reshape(len(rows), -1)
    Z, fill, mu, sd = _standardize(X)
    j = list(features).index("budget")
    A = _budget_terms(Z, X[:, j], transform)
    reg = Ridge(alpha=alpha).fit(A, Y)
    spread = float(max(0.005, np.sqrt(np.mean((reg.predict(A) - Y) ** 2))))
    member = {"kind": kind, "classes": ["high", *others], "fill": fill.tolist(), "mean": mu.tolist(),
              "scale": sd.tolist(), "budget_index": j, "coef": np.atleast_2d(reg.coef_).tolist(),
              "intercept": np.atleast_1d(reg.intercept_).tolist(), "spread": spread, "margin": RIDGE_MARGIN}
    return member


def _gap_logits(m: dict, X: np.ndarray) -> np.ndarray:
    z = _standardized(m, X)
    budget = np.where(np.isnan(X[:, m["budget_index"]]), 0.0, X[:, m["budget_index"]])
    transform = "log1p" if m["kind"] == "curve" else "linear"
    gaps = _budget_terms(z, budget, transform) @ np.array(m["coef"]).T + np.array(m["intercept"]) - m["margin"]
    return np.hstack([np.zeros((len(X), 1)), gaps]) / m["spread"]


# ---- constant ----------------------------------------------------------------------------------


def _constant_logits(m: dict, X: np.ndarray) -> np.ndarray:
    return np.tile(np.log(np.clip(np.array(m["proba"], dtype=float), 1e-9, 1)), (len(X), 1))


# ---- checks of members read from a file ---------------------------------------------------------


def _arr(x, shape) -> bool:
    """x is a nested list of finite numbers (not booleans, text or nulls) of exactly `shape`."""
    try:
        a = np.array(x, dtype=object)
    except (ValueError, TypeError):
        return False
    if a.shape != shape:
        return False
    return all(number(v) for v in a.ravel())


# A fitted member works on z-scored inputs (a spread below 1e-12 counts as 1), so its weights are
# small; a weight beyond MAX_WEIGHT would overflow the logits into no probability at all.
MIN_SCALE, MAX_WEIGHT = 1e-12, 1e6


def _check_linear(m: dict, n_features: int, k: int) -> str | None:
    gap = m["kind"] in ("ridge", "curve")
    rows, cols = (k - 1, 2 * n_features + (m["kind"] == "curve")) if gap else (k, n_features)
    if not (k >= 2 and all(_arr(m.get(n), (n_features,)) for n in ("fill", "mean", "scale"))
            and _arr(m.get("coef"), (rows, cols)) and _arr(m.get("intercept"), (rows,))
            and np.all(np.asarray(m["scale"], dtype=float) >= MIN_SCALE)
            and all(np.abs(np.asarray(m[n], dtype=float)).max(initial=0) <= MAX_WEIGHT for n in ("coef", "intercept"))):
        return f"{m['kind']} member"
    if gap:
        j = m.get("budget_index")
        if not (m["classes"][0] == "high" and _arr([m.get("spread"), m.get("margin")], (2,)) and m["spread"] > 0
                and whole(j, 0, n_features - 1)):
            return f"{m['kind']} member"
    return None


def _check_lightgbm(m: dict, n_features: int, k: int) -> str | None:
    if k < 2:
        return "tree count"
    return check_trees(m.get("trees"), n_features, k if k > 2 else 1)


def _check_constant(m: dict, n_features: int, k: int) -> str | None:
    return None if _arr(m.get("proba"), (k,)) else "constant member"


@dataclass(frozen=True)
class Kind:
    fit: Callable | None  # (X, y, classes, rows, features, seed) -> member; None: not fitted by users
    logits: Callable[[dict, np.ndarray], np.ndarray]
    check: Callable[[dict, int, int], str | None]


KINDS: dict[str, Kind] = {
    "logistic": Kind(_logistic_fit, _logistic_logits, _check_linear),
    "lightgbm": Kind(_lightgbm_fit, _lightgbm_logits, _check_lightgbm),
    "ridge": Kind(lambda X, y, c, rows, f, s: _gap_fit(X, rows, f, "ridge", 10.0, "linear"), _gap_logits, _check_linear),
    "curve": Kind(lambda X, y, c, rows, f, s: _gap_fit(X, rows, f, "curve", 30.0, "log1p"), _gap_logits, _check_linear),
    "constant": Kind(None, _constant_logits, _check_constant),
}
FITTABLE = tuple(k for k, v in KINDS.items() if v.fit is not None)
MAX_MEMBERS = 256
GAP_KINDS = ("ridge", "curve")  # fitted on accuracy gaps, so they need every row's accuracies, not just labels


def check_member(m, n_features: int, bad, options: Sequence[str] = SETS) -> None:
    """Raise `bad(why)` unless `m` is a well-formed member over `n_features` inputs."""
    if not isinstance(m, dict) or not isinstance(m.get("kind"), str) or m["kind"] not in KINDS:
        raise bad("member kind")
    classes = m.get("classes")
    if not (isinstance(classes, list) and classes and all(isinstance(c, str) for c in classes)
            and len(set(classes)) == len(classes) and set(classes) <= set(options)):
        raise bad("member classes")
    why = KINDS[m["kind"]].check(m, n_features, len(classes))
    if why:
        raise bad(why)


def member_proba(m: dict, X: np.ndarray, options: Sequence[str] = SETS) -> np.ndarray:
    """Probabilities over `options` (columns) for one member; options it never saw get 0."""
    logits = KINDS[m["kind"]].logits(m, X)
    logits = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    p = e / e.sum(axis=1, keepdims=True)
    out = np.zeros((len(X), len(options)))
    for j, c in enumerate(m["classes"]):
        out[:, list(options).index(c)] = p[:, j]
    return out


def fit_member(rows: Sequence[dict], kind: str, features: Sequence[str], seed: int = 0) -> dict:
    if kind not in FITTABLE:
        raise InputError(f"unknown predictor kind {kind!r}: use {' or '.join(FITTABLE)}")
    labels = [r["label"] for r in rows]
    classes = tuple(sorted(set(labels), key=option_order)) or ("high",)
    X = matrix(rows, features)
    if kind not in GAP_KINDS and len(classes) < 2:
        return {"kind": "constant", "classes": list(classes), "proba": [1.0]}
    y = np.array([classes.index(lab) for lab in labels])
    return KINDS[kind].fit(X, y, classes, rows, features, seed)


def bootstrap(rows: Sequence[dict], seed: int) -> list[dict]:
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

    samples = [list(rows)] + [bootstrap(rows, seed * 1000 + b) for b in range(1, n_members)]
    if jobs == 1:
        return [fit_member(s, kind, features, seed + b) for b, s in enumerate(samples)]
    return Parallel(n_jobs=jobs)(delayed(fit_member)(s, kind, features, seed + b) for b, s in enumerate(samples))
