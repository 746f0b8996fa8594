"""The fitted predictor: an ensemble of members, what it needs to judge a new student against its
data, and its file.

    predictor = fit_predictor(rows, kind="lightgbm")   # bagged members, calibrated range, unit table
    predictor.save("predictor/"); Predictor.load("predictor/").advise(measured, budget=3, score="sum")

The ensemble's members are fitted on bootstrap resamples of the calibration units; their spread
gives an interval on each probability. For every input it stores the calibrated range, and the
standardized measurements of every calibration unit, so `advise` can say whether a student is
inside the data, which calibrated students are nearest and what they measured.

Saved as one JSON file. It is parsed with hooks that refuse NaN, Infinity, numbers that overflow
a float and integers of more than 30 digits, and every field is checked for type, shape and
range before use (`checks`): a crafted file gives one InputError, never a crash, a hang or a huge
allocation. The sha256 inside only detects damage; it is not a signature.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from capacity_advisor.core.numbers import number
from capacity_advisor.advisor.predictor.advice import Advice
from capacity_advisor.advisor.predictor.checks import unit_ok, check_meta
from capacity_advisor.core.numbers import strict_loads
from capacity_advisor.advisor.predictor.labels import NOT_MEASURED, PROBE_FEATURES, matrix, model_inputs, options_in
from capacity_advisor.advisor.predictor.members import MAX_MEMBERS, check_member, fit_members, member_proba
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import atomic_path, finite
from capacity_advisor.training.manifest import SETS, schedule_of

FORMAT = 2
MAX_FILE_BYTES = 64 << 20
MAX_FEATURES = 512
MAX_UNITS = 100_000


def _json_num(x: float):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def distances(Z: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Root-mean-square difference of `z` from every row of `Z`, over the inputs both have (NaN
    inputs are skipped; a row sharing none with `z` is infinitely far)."""
    d = Z - z
    ok = ~np.isnan(d)
    n = ok.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        rms = np.sqrt((np.where(ok, d, 0.0) ** 2).sum(axis=1) / n)
    return np.where(n > 0, rms, np.inf)


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

    def member_probas(self, rows_or_inputs: Sequence[dict]) -> np.ndarray:
        """Each member's probabilities for label rows or `model_inputs` dicts: (members, rows, options)."""
        X = matrix(rows_or_inputs, self.features)
        return np.stack([member_proba(m, X, self.options) for m in self.members])

    def predict_proba(self, rows_or_inputs: Sequence[dict]) -> np.ndarray:
        return self.member_probas(rows_or_inputs).mean(axis=0)

    def predict(self, rows_or_inputs: Sequence[dict]) -> list[str]:
        return [self.options[i] for i in self.predict_proba(rows_or_inputs).argmax(axis=1)]

    def over_budgets(self, measured: dict, budgets: Sequence[float], score: str) -> np.ndarray:
        """P(each option is best) for one student's measurements at each of `budgets`: (budgets, options)."""
        return self.predict_proba([model_inputs(measured, b, score) for b in budgets])

    def interval(self, measured: dict, budget: float, score: str, lo: float = 10, hi: float = 90) -> dict:
        """Per option, the members' lo-th and hi-th percentile of its probability."""
        p = self.member_probas([model_inputs(measured, budget, score)])[:, 0, :]
        return {s: (float(np.percentile(p[:, j], lo)), float(np.percentile(p[:, j], hi))) for j, s in enumerate(self.options)}

    # ---- where the student sits among the calibrated ones --------------------------------------
    def measured(self) -> list[str]:
        return [k for k in self.features if k not in NOT_MEASURED]

    def _z(self, features: dict) -> np.ndarray:
        nan = {"mean": float("nan"), "sd": 1.0}  # an input the calibration never measured
        X = matrix([features], self.measured())[0]
        return np.array([(x - self.range.get(k, nan)["mean"]) / self.range.get(k, nan)["sd"]
                         for k, x in zip(self.measured(), X)])

    def range_check(self, features: dict, slack: float = 0.1) -> list[dict]:
        """Per measured input (not the budget or the ranking): its value, the calibrated [min,
        max], and whether the value lies inside (with `slack` times the range on each side)."""
        out = []
        X = matrix([features], self.measured())[0]
        for k, v in zip(self.measured(), X):
            r = self.range.get(k)
            if r is None:
                continue
            width = max(r["max"] - r["min"], 1e-12)
            inside = None if math.isnan(v) else bool(r["min"] - slack * width <= v <= r["max"] + slack * width)
            out.append({"feature": k, "value": None if math.isnan(v) else float(v), "min": r["min"], "max": r["max"],
                        "inside": inside})
        return out

    def unit_matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """(standardized measurements, student) of every calibration unit."""
        Z = np.array([u["z"] for u in self.units], dtype=float).reshape(len(self.units), -1)
        return Z, np.array([str(u.get("student")) for u in self.units])

    def neighbours(self, features: dict, k: int = 3, student: str | None = None) -> list[dict]:
        """The calibrated units nearest to this student in standardized probe measurements
        (leaving out units of `student` itself, as the typical distance does)."""
        if not self.units:
            return []
        Z, students = self.unit_matrix()
        d = distances(Z, self._z(features))
        order = [i for i in np.argsort(d, kind="stable") if students[i] != student][:k]
        return [{**{kk: v for kk, v in self.units[i].items() if kk != "z"}, "distance": float(d[i])} for i in order]

    def advise(self, measured: dict, budget: float, score: str, student: str | None = None) -> Advice:
        """At the epoch `budget`, with the sets ranked by `score`: probabilities, interval, range
        check, neighbours (other than `student`'s own units), and a confidence with its reasons."""
        per_member = self.member_probas([model_inputs(measured, budget, score)])[:, 0, :]
        probs = {s: float(v) for s, v in zip(self.options, per_member.mean(axis=0))}
        choice = max(probs, key=probs.get)
        interval = {s: (float(np.percentile(per_member[:, j], 10)), float(np.percentile(per_member[:, j], 90)))
                    for j, s in enumerate(self.options)}
        checks = self.range_check(measured)
        outside = [c for c in checks if c["inside"] is False]
        near = self.neighbours(measured, student=student)
        far = bool(near) and math.isfinite(self.typical_distance) and near[0]["distance"] > self.typical_distance
        others_hi = max((interval[s][1] for s in self.options if s != choice), default=0.0)
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
        return Advice(strategy=choice, probabilities=probs, interval=interval, confidence=confidence,
                      confidence_reasons=tuple(words), range=checks, neighbours=near, outside=len(outside) > 0)

    def reasons(self, measured: dict, budget: float, score: str, k: int = 3) -> list[dict]:
        """The inputs (the budget among them) that moved the chosen option's probability most at
        `budget`, by replacing each with its calibrated mean (an occlusion measure that works for
        every member kind): those that push toward the choice first, then those against it. One
        batched evaluation."""
        features = model_inputs(measured, budget, score)
        keys = [key for key in self.features if key in self.range]
        rows = [features] + [{**features, key: self.range[key]["mean"]} for key in keys]
        p = self.predict_proba(rows)
        choice = int(p[0].argmax())
        values = matrix([features], keys)[0] if keys else []
        out = [{"feature": key, "value": float(v), "weight": float(p[0][choice] - p[i + 1][choice]),
                "toward": self.options[choice] if p[0][choice] >= p[i + 1][choice] else f"not {self.options[choice]}"}
               for i, (key, v) in enumerate(zip(keys, values)) if abs(p[0][choice] - p[i + 1][choice]) > 1e-6]
        out.sort(key=lambda r: (r["weight"] <= 0, -abs(r["weight"])))
        return out[:k]

    # ---- persistence -----------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": FORMAT, "kind": self.kind, "features": list(self.features), "options": list(self.options),
                "members": self.members,
                "range": self.range, "units": finite(self.units), "typical_distance": _json_num(self.typical_distance),
                "meta": finite(self.meta)}

    def save(self, folder: str | Path) -> Path:
        """Write OUT/predictor.json, after checking it as `load` will (a file that could not be
        loaded back is never written)."""
        body = self.to_dict()
        blob = json.dumps(body, sort_keys=True, allow_nan=False)
        raw = {"sha256": hashlib.sha256(blob.encode()).hexdigest(), **body}
        Predictor.from_dict(json.loads(json.dumps(raw)), "about to be written")
        path = Path(folder) / "predictor.json"
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(raw, indent=1, allow_nan=False) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, folder: str | Path) -> "Predictor":
        path = Path(folder) / "predictor.json"
        if not path.is_file():
            raise InputError(f"no predictor at {folder} (predictor.json missing): run `advisor fit` or drop --predictor")
        if path.stat().st_size > MAX_FILE_BYTES:
            raise InputError(f"predictor file {path} is {path.stat().st_size:,} bytes, more than any predictor needs; refit it")
        try:
            raw = strict_loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            why = type(e).__name__ if not isinstance(e, ValueError) or isinstance(e, json.JSONDecodeError) else str(e)[:80]
            raise InputError(f"predictor file {path} is damaged ({why}); refit it with `advisor fit`") from None
        return cls.from_dict(raw, str(path))

    @classmethod
    def from_dict(cls, raw: dict, where: str = "predictor") -> "Predictor":
        def bad(why: str) -> InputError:
            return InputError(f"predictor file {where} is damaged ({why}); refit it with `advisor fit`")

        if not isinstance(raw, dict):
            raise bad("not a JSON object")
        if raw.get("format") != FORMAT:
            raise InputError(f"predictor {where} has format {str(raw.get('format'))[:20]!r}, this version reads {FORMAT}; "
                             "refit it with `advisor fit`")
        body = {k: v for k, v in raw.items() if k != "sha256"}
        try:
            digest = hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode()).hexdigest()
        except (TypeError, ValueError):
            raise bad("unreadable content") from None
        if raw.get("sha256") != digest:
            raise bad("its content does not match its sha256")
        feats = raw.get("features")
        if not (isinstance(feats, list) and 0 < len(feats) <= MAX_FEATURES and all(isinstance(f, str) for f in feats)
                and len(set(feats)) == len(feats)):
            raise bad("features")
        if not isinstance(raw.get("kind", ""), str):
            raise bad("kind")
        options = raw.get("options", list(SETS))
        try:
            if not (isinstance(options, list) and options and len(options) <= 64 and all(isinstance(o, str) for o in options)
                    and len(set(options)) == len(options)):
                raise InputError("options")
            for o in options:
                schedule_of(o)
        except InputError:
            raise bad("options") from None
        members = raw.get("members")
        if not isinstance(members, list) or not members:
            raise bad("no members")
        if len(members) > MAX_MEMBERS:
            raise bad(f"more than {MAX_MEMBERS} members")
        for m in members:
            check_member(m, len(feats), bad, options)
        rng = raw.get("range") or {}
        if not isinstance(rng, dict) or not all(
                isinstance(k, str) and isinstance(v, dict) and all(number(v.get(x)) for x in ("min", "max", "mean", "sd"))
                and v["sd"] > 0 and v["min"] <= v["max"] for k, v in rng.items()):
            raise bad("range")
        units = raw.get("units") or []
        n_z = len([f for f in feats if f not in NOT_MEASURED])
        if not isinstance(units, list) or len(units) > MAX_UNITS or not all(unit_ok(u, n_z) for u in units):
            raise bad("units")
        td = raw.get("typical_distance")
        if td is not None and not number(td):
            raise bad("typical_distance")
        meta = raw.get("meta") if raw.get("meta") is not None else {}
        why = check_meta(meta, options)
        if why:
            raise bad(f"meta.{why}")
        return cls(tuple(feats), members, str(raw.get("kind", "")), tuple(options), rng, units,
                   float(td) if td is not None else float("nan"), meta)


def fit_predictor(rows: Sequence[dict], kind: str = "logistic", features: Sequence[str] = PROBE_FEATURES,
                  n_members: int = 24, seed: int = 0, jobs: int = 1) -> Predictor:
    """The bagged ensemble with its calibrated range and the unit table for neighbours."""
    members = fit_members(rows, kind, features, n_members, seed, jobs)
    X = matrix(rows, features)
    rng = {}
    for j, k in enumerate(features):
        col = X[:, j][~np.isnan(X[:, j])]
        if len(col):
            sd = float(col.std())
            rng[k] = {"min": float(col.min()), "max": float(col.max()), "mean": float(col.mean()),
                      "sd": sd if sd > 1e-12 else 1.0}
    pred = Predictor(tuple(features), members, kind, options_in(rows), rng)
    by_unit: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_unit[r["unit"]].append(r)
    pred.units = []
    for u, rs in sorted(by_unit.items()):
        r0 = rs[0]
        pred.units.append({"unit": u, "student": str(r0["student"]), "task": str(r0["task"]),
                           "source": str(r0.get("source")), "teacher": str(r0.get("teacher")), "score": str(r0["score"]),
                           "seed": r0["seed"], "n_params": r0.get("n_params"),
                           "z": [_json_num(v) for v in pred._z(r0["features"])],
                           "outcomes": {f"{r['budget']:g}": {"label": r["label"],
                                                                          **{s: round(a, 4) for s, a in r["accuracy"].items()}}
                                        for r in rs}})
    Z, students = pred.unit_matrix()
    nearest = [distances(Z[students != students[i]], Z[i]).min(initial=np.inf) for i in range(len(pred.units))]
    finite_near = [d for d in nearest if np.isfinite(d)]
    pred.typical_distance = float(np.percentile(finite_near, 95)) if finite_near else float("nan")
    return pred

