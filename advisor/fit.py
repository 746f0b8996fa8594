"""`advisor fit`: from RunRecords to the predictor folder `advisor recommend` reads.

    fit_and_save(read_records("calibration/records.jsonl"), "advisor/predictor_data", FitSettings(kinds=("lightgbm",)))

Measures the policy on every split of `cv` beside the constant rules, the size rule and the noise
floor — nested: inside each outer fold the model kind (among `kinds`) and the thresholds are
chosen on the fold's training rows only, by leaving one `choose_by` value out (a pool source by
default; several splits: the worse of their regrets) —; then chooses the kind and
the thresholds the same way on all the records, fits the ensemble on every row and saves one file
with the lab prior for `--no-probe`, the probe recipe its inputs were measured with and the policy.
The policy's gate (where the advice is a race of D_high against D_low, `predictor.gate`) is chosen
on the same held-out measurements under the overhead cap `gate.CAP`, and measured the same nested
way ("gated race" in every table).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from capacity_advisor.advisor.predictor import (
    CV_SPLITS, FEATURE_SETS, FITTABLE, LARGEST_PROXY, PROXY, Rule, SPLITS, TIE_MARGIN, WITHOUT_PROXIES, cross_validate,
    fit_predictor, folds, label_rows, options_in, read_records, select_policy, unit_of,
)
from capacity_advisor.advisor.predictor.gate import (
    COSTS, GAP_SCOUTS, NO_SCOUT, RACE_GRIDS, SCOUTS, SCOUTS_BOTH, as_scout, with_hold,
)
from capacity_advisor.advisor.predictor.labels import NOT_MEASURED, matrix, ranking_sum
from capacity_advisor.advisor.predictor.policy import (
    CHOOSE_BY, EITHER, EITHER_PREDICTOR, PROXY_RULE, choose_policy, measured_policy, with_gate,
)
from capacity_advisor.advisor.predictor.priors import fit_lab_prior
from capacity_advisor.advisor.predictor.proxy_rule import choose_rule, lead
from capacity_advisor.advisor.predictor.races import race_summary, with_curves
from capacity_advisor.core.errors import InputError
from capacity_advisor.core.files import advisor_home, check_writable_dir, stable_hash
from capacity_advisor.core.numbers import number, whole
from capacity_advisor.probes.recipe import LENGTHS, MEASURING
from capacity_advisor.training.manifest_checks import MAX_SEED

CV_METHODS = ("policy", "gated race", "predictor", WITHOUT_PROXIES, LARGEST_PROXY, PROXY_RULE, EITHER, EITHER_PREDICTOR,
              "always high", "always low", "always mixed", "size rule", "noise floor")


def probe_of(records: Sequence[dict]) -> dict | None:
    """How every record's features were measured, as far as they all say the same: the recipe's
    `kind` and every measuring setting the records agree on, when they state whole recipes that
    differ at most in their lengths (the lengths follow the task and the lab recipe, and a probe of
    the predictor's kind takes its own); else only the steps and held-out problems they state —
    nothing is filled in from today's defaults. `advisor recommend` then probes that way by default."""
    recipes, short = [], set()
    for rec in records:
        p = (rec.get("settings") or {}).get("probe") if isinstance(rec.get("settings"), dict) else None
        if not (isinstance(p, dict) and all(whole(p.get(k), 1) for k in ("steps", "eval_problems"))):
            return None
        if p.get("kind") in ("lab", "real") and all(whole(p.get(k), 0) for k in MEASURING):
            recipes.append(p)
        short.add((("steps", p["steps"]), ("eval_problems", p["eval_problems"])))
    if recipes:
        agreed = {k: recipes[0][k] for k in ("kind", *MEASURING) if all(r[k] == recipes[0][k] for r in recipes)}
        whole_recipes = len(recipes) == len(records) and all(k in agreed for k in ("kind", *MEASURING)
                                                               if k not in LENGTHS)
        return agreed if whole_recipes else None
    return dict(short.pop()) if len(short) == 1 else None


def record_files(paths: Sequence[str]) -> tuple[list[dict], list[dict]]:
    """The records of every file in `paths`, and per file what `meta.record_files` states: its
    name (not its path), how many records, and the pool sources it holds. Refused: a file named
    twice, and files whose probes were measured otherwise than the first's (another recipe in any
    setting but the lengths): the predictor would read their features as if measured alike.

    A record that repeats one read before (in the same file or an earlier one: the same run with the
    same measurements, whatever its provenance says of when and where it ran) is dropped, so that no
    run weighs twice in the fit or its held-out tables; the file's entry says how many (`repeated`)."""
    seen, records, files, first, known = set(), [], [], None, set()
    for path in paths:
        key = Path(path).resolve()
        if key in seen:
            raise InputError(f"--records {path} is named twice: name each records file once")
        seen.add(key)
        recs = read_records(path)
        recipe = probe_of(recs)
        if first is not None and recipe is not None and first[1] is not None:
            # the kind may differ: a probe of another kind of student takes the recipe but its lengths
            differ = [k for k in ("steps", "batch_size", "eval_every", "eval_problems", "warmup_steps")
                      if k in recipe and k in first[1] and recipe[k] != first[1][k]]
            if differ:
                raise InputError(f"--records {path} measured its probes otherwise than {first[0]} ("
                                 + ", ".join(f"{k} {recipe[k]} against {first[1][k]}" for k in differ)
                                 + "): replay them at one probe (`advisor lab replay FOLDER --out R`) or fit them apart")
        if first is None:
            first = (path, recipe)
        kept = []
        for rec in recs:
            key = stable_hash({k: v for k, v in rec.items() if k != "provenance"}, 32)
            if key not in known:
                known.add(key)
                kept.append(rec)
        records += kept
        files.append({"file": Path(path).name, "records": len(kept), "sources": sorted({unit_of(r)["source"] for r in kept}),
                      **({"repeated": len(recs) - len(kept)} if len(kept) < len(recs) else {})})
    return records, files


def own_sources(records: Sequence[dict], files: Sequence[dict] | None) -> dict:
    """{source: {"students", "n_params", "fingerprints", "epochs"}} for the pool sources only files
    after the first hold (a user's own calibration beside the shipped one): the students calibrated
    on it, the content hashes of its pools (by which `advisor recommend` knows the pool again) and
    the longest run's epochs."""
    if not files or len(files) < 2:
        return {}
    base = set(files[0]["sources"])
    out: dict[str, dict] = {}
    for rec in records:
        u = unit_of(rec)
        if u["source"] in base:
            continue
        o = out.setdefault(u["source"], {"students": {}, "fingerprints": set(), "epochs": 0.0})
        o["students"][u["student"]] = int((rec.get("model") or {}).get("n_params") or 0)
        if number(rec.get("epochs")):
            o["epochs"] = max(o["epochs"], float(rec["epochs"]))
        fp = (rec.get("pool") or {}).get("fingerprint")
        if isinstance(fp, str) and 0 < len(fp) <= 128:
            o["fingerprints"].add(fp)
    return {s: {"students": sorted(o["students"]), "n_params": [o["students"][k] for k in sorted(o["students"])],
                "fingerprints": sorted(o["fingerprints"]), "epochs": o["epochs"]} for s, o in sorted(out.items())}


def with_proxy_leads(own: dict, rows: Sequence[dict]) -> dict:
    """`own` with each source's `proxy_leads`: [n_params, budget, ranking_sum, lead] per proxy,
    budget and ranking, the lead being D_low's best held-out accuracy within the budget minus
    D_high's, averaged over the proxy's seeds (what `advisor recommend`'s proxy rule reads)."""
    from collections import defaultdict
    from statistics import mean

    out = {}
    for source, o in own.items():
        by = defaultdict(list)
        for r in rows:
            if r["source"] == source:
                by[(int(r["n_params"] or 0), float(r["budget"]), ranking_sum(r["score"]))].append(lead(r))
        out[source] = {**o, "proxy_leads": [[*k, mean(v)] for k, v in sorted(by.items())]}
    return out


MEMBERS, MAX_MEMBERS, MAX_JOBS = 24, 256, 256  # ensemble members: the default and the most a fit takes
CV_MEMBERS = 8  # members of each held-out fit: `advisor fit --cv-members`
MAX_OPEN_CAP_TOKENS = 10.0  # `--open-cap` with `--cost tokens`: a race may cost several runs' tokens
MAX_DRAWS = 16  # `advisor fit --gate-draws`: each draw costs the held-out fits the choices are made on again


@dataclass(frozen=True)
class FitSettings:
    """`advisor fit`'s settings: each default, bound and flag help stated here once (the verb's
    flags are these fields, `cli.options.field_option`); `check` runs before any record is read."""

    tie_margin: float = field(default=TIE_MARGIN, metadata={"help": "Accuracy gap under which strategies count as tied."})
    features: str = field(default="contrast", metadata={"help": (
        "contrast: D_low against D_high only, relative to the base (the inputs that held best leaving a pool source "
        "out); probe: every input a probe measures; +teacher: also the teacher view (needs --teacher at recommend).")})
    kinds: tuple[str, ...] = field(default=FITTABLE, metadata={"help": (
        "Model kinds to cross-validate; the one whose policy does best leaving --choose-by out is kept.")})
    cv: tuple[str, ...] = field(default=SPLITS, metadata={"help": (
        "Held-out tables to measure: comma-separated splits; add proxy for a large student advised with its own pool "
        "source's small students in the fit (the costliest table, so not by default).")})
    choose_by: tuple[str, ...] = field(default=CHOOSE_BY, metadata={"help": (
        "The splits whose held-out regret chooses the kind and the policy's thresholds (comma-separated; several: "
        "the worse of them counts).")})
    open_cap: float | None = field(default=None, metadata={"help": (
        "The most the races the gate opens may cost on average, as a share of one run (e.g. 0.5: a user whose gate "
        "opens trains at most half a run more; with --cost tokens, in tokens); default: no bound beyond the mean over "
        "all pools.")})
    cost: str = field(default="share", metadata={"help": (
        "What the gate's overhead caps count: share (the losing set's training as a share of one run) or tokens "
        "(its tokens over the kept set's run's: what a race costs where D_low's responses are longer or shorter "
        "than D_high's).")})
    race_grid: str = field(default="fixed", metadata={"help": (
        "The races the gate may open: fixed (a share of the budget, or waiting for a gaining D_low; the shipped "
        "grid), adaptive (also races that stop once one set clearly leads), patient (also adaptive races that a "
        "D_high lead stops only once D_low is seen not gaining), tie (also races that stop for D_high at an early "
        "check where D_low has not led and is not gaining, alone or beside a stop on a clear lead), fast (also races "
        "that stop sooner, at 20-50 % of the budget, where the probe shows a fast learner: its faster set raised "
        "held-out accuracy by 0.1-0.3 or more).")})
    scout: bool = field(default=False, metadata={"help": (
        "Also offer the gate a scout: where the probe's own accuracy-gain contrast for D_low reaches it, D_low "
        "without a race (the probe already raced both sets on held-out problems).")})
    high_scout: bool = field(default=False, metadata={"help": (
        "Beside --scout's, also offer a scout for D_high: where the gate would open but D_high's accuracy gain in "
        "the probe leads D_low's by 0.3 or 0.5, D_high without a race.")})
    gap_scout: bool = field(default=False, metadata={"help": (
        "Also offer the gate a scout that needs no training: where the pool's likelihood gap per token under the "
        "base, ranked by the sum, is 0, -0.25, -0.5 or -1 or less (D_high's responses less likely per token than "
        "D_low's), D_low without a race.")})
    gap_scout_at: float | None = field(default=None, metadata={"help": (
        "The gap scout at this threshold only, in every held-out fold and in the fit (not chosen among --gap-scout's): "
        "where the pool's likelihood gap per token under the base, ranked by the sum, is at or under it, D_low without "
        "a race. A number from -10 to 0.")})
    gap_scout_added: bool = field(default=False, metadata={"help": (
        "With --gap-scout-at: add that scout to the gate chosen without it (its thresholds, race and probe scout "
        "as a fit without the gap scout chooses them), in every held-out fold and in the fit, rather than choosing "
        "the gate with the scout in place.")})
    race_hold: tuple[float, ...] = field(default=(0.0,), metadata={"help": (
        "Where the gate's race stops without a lead, D_low is kept only on a lead beyond this many standard errors "
        "of the held-out problems (0: any lead): comma-separated values from 0 to 10, each offered with every race "
        "of --race-grid, chosen held out as the race is (e.g. 0,1).")})
    race_hold_added: float | None = field(default=None, metadata={"help": (
        "Set this hold (standard errors, 0 to 10) on the gate chosen without one (its thresholds, race and scouts as "
        "a fit without a hold chooses them), in every held-out fold and in the fit, rather than offering it to the "
        "choice as --race-hold does.")})
    race_tie_added: float | None = field(default=None, metadata={"help": (
        "Set a tie check at this share of the budget (0 to 1) on the gate chosen without one, in every held-out fold "
        "and in the fit: there its race stops for D_high unless D_low has led or is gaining. A gate whose race stops "
        "at or before the share keeps none.")})
    n_members: int = field(default=MEMBERS, metadata={"help": "Ensemble members (bootstrap resamples of the calibration units)."})
    jobs: int = field(default=1, metadata={"help": "Processes fitting members in parallel."})
    seed: int = field(default=0, metadata={"help": "Bootstrap draws and LightGBM's seed."})
    note: str | None = field(default=None, metadata={"help": "A line stored with the predictor (what the records were)."})
    cv_members: int = field(default=CV_MEMBERS, metadata={"help": (
        "Ensemble members of each held-out fit: the held-out tables' P(D_low), which the policy's thresholds and the "
        "gate are chosen on (their cost grows with it; --members is the saved ensemble's).")})
    gate_draws: int = field(default=1, metadata={"help": (
        "Bootstrap draws of those held-out fits, pooled (seeds --seed, --seed + 1, …): the kind, the policy's "
        "thresholds and the gate are chosen over the draws' noise rather than on one draw (the choice's cost grows "
        "with it).")})

    def check(self) -> None:
        """Every setting's value, all wrong ones in one InputError."""
        bad = []
        if not (number(self.tie_margin) and 0 <= self.tie_margin < 1):
            bad.append(f"--tie-margin {self.tie_margin} must be a number from 0 to 1")
        if self.features not in FEATURE_SETS:
            bad.append(f"--features {self.features!r} is unknown: use {', '.join(FEATURE_SETS)}")
        for flag, v, lo, hi in (("--members", self.n_members, 1, MAX_MEMBERS), ("--jobs", self.jobs, 1, MAX_JOBS),
                                ("--seed", self.seed, 0, MAX_SEED), ("--cv-members", self.cv_members, 1, MAX_MEMBERS),
                                ("--gate-draws", self.gate_draws, 1, MAX_DRAWS)):
            if not whole(v, lo, hi):
                bad.append(f"{flag} {v!r} must be a whole number from {lo} to {hi}")
        unknown = [k for k in self.kinds if k not in FITTABLE]
        if unknown or not self.kinds:
            bad.append(f"--kinds {','.join(self.kinds) or '(none)'}: use {', '.join(FITTABLE)}")
        unknown = [s for s in self.cv if s not in CV_SPLITS]
        if unknown:
            bad.append(f"--cv {','.join(unknown)}: use {', '.join(CV_SPLITS)}")
        most = MAX_OPEN_CAP_TOKENS if self.cost == "tokens" else 1
        if self.open_cap is not None and not (number(self.open_cap) and 0 < self.open_cap <= most):
            bad.append(f"--open-cap {self.open_cap} must be a share of one run, above 0 and at most 1" if most == 1 else
                       f"--open-cap {self.open_cap} must be above 0 and at most {most:g} (with --cost tokens, the losing "
                       "set's tokens over the kept set's run's, which can pass one run where D_low is the longer set)")
        if self.gap_scout_at is not None:
            if not (number(self.gap_scout_at) and -10 <= self.gap_scout_at <= 0):
                bad.append(f"--gap-scout-at {self.gap_scout_at!r} must be a number from -10 to 0 (a likelihood gap per "
                           "token in nats: D_high's responses that much less likely per token than D_low's)")
            if self.gap_scout:
                bad.append("--gap-scout chooses the gap scout's threshold and --gap-scout-at fixes it: give one of them")
        elif self.gap_scout_added:
            bad.append("--gap-scout-added adds the scout --gap-scout-at fixes: give --gap-scout-at G too")
        if not self.race_hold or not all(number(h) and 0 <= h <= 10 for h in self.race_hold):
            bad.append(f"--race-hold {','.join(map(str, self.race_hold)) or '(none)'}: give standard errors from 0 to "
                       "10, comma-separated, e.g. 0,1")
        if self.race_hold_added is not None:
            if not (number(self.race_hold_added) and 0 <= self.race_hold_added <= 10):
                bad.append(f"--race-hold-added {self.race_hold_added!r} must be standard errors from 0 to 10, e.g. 1")
            if any(self.race_hold):
                bad.append("--race-hold offers holds to the gate's choice and --race-hold-added sets one after it: give "
                           "one of them")
        if self.race_tie_added is not None and not (number(self.race_tie_added) and 0 < self.race_tie_added < 1):
            bad.append(f"--race-tie-added {self.race_tie_added!r} must be a share of the budget between 0 and 1, e.g. 0.5")
        if self.cost not in COSTS:
            bad.append(f"--cost {self.cost!r} is unknown: use {', '.join(COSTS)}")
        if self.race_grid not in RACE_GRIDS:
            bad.append(f"--race-grid {self.race_grid!r} is unknown: use {', '.join(RACE_GRIDS)}")
        if not self.choose_by or any(s not in SPLITS for s in self.choose_by):
            bad.append(f"--choose-by {','.join(self.choose_by) or '(none)'}: one or more of {', '.join(SPLITS)}")
        if whole(self.seed, 0, MAX_SEED) and whole(self.gate_draws, 1, MAX_DRAWS) and self.seed + self.gate_draws - 1 > MAX_SEED:
            bad.append(f"--seed {self.seed} with --gate-draws {self.gate_draws} passes the last seed, {MAX_SEED}: "
                       "choose a lower --seed")
        if bad:
            raise InputError("; ".join(bad))


def draw_gate(measured: Sequence[Sequence[dict]], draw: int, open_cap, races: tuple, scouts: tuple, cost: str = "share",
              added: dict | None = None):
    """The thresholds and gate one bootstrap draw's held-out measurements alone choose (the kind kept):
    beside the pooled choice, how much pooling the draws settled."""
    sets = [[m for m in ms if m.get("draw") == draw] for ms in measured]
    if not sets or not all(sets):
        return None
    return with_gate(choose_policy(*sets), sets, open_cap=open_cap, races=races, scouts=scouts, cost=cost,
                     added=added).gate


def fit_and_save(records: Sequence[dict], out: str | Path, settings: FitSettings = FitSettings(), log=None,
                 files: Sequence[dict] | None = None) -> dict:
    """Choose the kind, measure it on every split of `settings.cv`, choose the policy, fit and save.
    `files` (from `record_files`) names the record files; pool sources only later files hold are
    the user's own, and a second policy is chosen for a student advised on one of them (on the
    proxy split: a large student fitted with its own source's small students)."""
    settings.check()
    tie_margin, features, kinds, n_members, seed, jobs, cv_members, draws = (
        settings.tie_margin, settings.features, settings.kinds, settings.n_members, settings.seed, settings.jobs,
        settings.cv_members, settings.gate_draws)
    say = log or (lambda msg: None)
    feats = FEATURE_SETS[features]
    rows = with_curves(label_rows(records, tie_margin=tie_margin), records)
    if not rows:
        raise InputError("the records hold no (student, pool) with both a high and a low run: nothing to learn from")
    if len({r["student"] for r in rows}) < 2:
        raise InputError("the records hold one student only: a predictor needs at least two to be measured on "
                         "students it was not fitted on")
    measured = [k for k in feats if k not in NOT_MEASURED]
    if not np.isfinite(matrix(rows, measured)).any():
        raise InputError(f"the records measure none of the --features {features} inputs ({', '.join(measured[:4])}"
                         f"{', …' if len(measured) > 4 else ''}): choose another --features set")
    # the splits that choose the policy: those these records can hold one value out of (else students)
    split = tuple(s for s in settings.choose_by if folds(rows, s)) or ("student",)
    by = " and ".join(f"leave-one-{s}-out" for s in split) + (" (the worse)" if len(split) > 1 else "")
    cv_tables = {}
    races = tuple(with_hold(r, h) for r in RACE_GRIDS[settings.race_grid] for h in dict.fromkeys(settings.race_hold))
    scouts = SCOUTS_BOTH if settings.high_scout else SCOUTS if settings.scout else NO_SCOUT
    if settings.gap_scout:
        scouts = tuple((*as_scout(sc)[:2], gap) for sc in scouts for gap in GAP_SCOUTS)
    elif settings.gap_scout_at is not None and not settings.gap_scout_added:
        scouts = tuple((*as_scout(sc)[:2], float(settings.gap_scout_at)) for sc in scouts)
    # gate fields set on each chosen gate after the choice (in every held-out fold and in the fit)
    added = {**({"gap_scout": float(settings.gap_scout_at)} if settings.gap_scout_added else {}),
             **({"hold": float(settings.race_hold_added)} if settings.race_hold_added is not None else {}),
             **({"tie": float(settings.race_tie_added)} if settings.race_tie_added is not None else {})} or None
    for s in settings.cv:
        if not folds(rows, s):
            continue
        say(f"cross-validating {', '.join(kinds)}, one {s} held out at a time (kind and thresholds chosen inside "
            "each fold)")
        cv_tables[s] = cross_validate(rows, s, kinds, feats, cv_members, tie_margin, seed, jobs,
                                      policy_split=split, open_cap=settings.open_cap, races=races, scouts=scouts,
                                      draws=draws, cost=settings.cost, added=added)
    say(f"choosing the kind and the policy's thresholds by {by} regret")
    chosen, policy, kind_regret, measured_rows = measured_policy(rows, split, kinds, feats, cv_members, seed, jobs,
                                                                 races, scouts, draws, settings.cost)
    policy = with_gate(policy, measured_rows, open_cap=settings.open_cap, races=races, scouts=scouts, cost=settings.cost,
                       added=added)
    alone = ([draw_gate(measured_rows, d, settings.open_cap, races, scouts, settings.cost, added) for d in range(draws)]
             if draws > 1 else [])
    own = own_sources(records, files)
    policy_own = None
    if own and folds(rows, PROXY):
        say("choosing the policy's thresholds for your own pool sources by leave-one-proxy-target-out regret")
        _, policy_own, _ = select_policy(rows, PROXY, chosen, feats, cv_members, seed, jobs, draws, races,
                                       scouts, settings.cost)
        own = with_proxy_leads(own, rows)
    say(f"fitting {n_members} {chosen} members on {len(rows)} rows")
    pred = fit_predictor(rows, chosen, feats, n_members, seed, jobs)
    recipe = probe_of(records)
    pred.meta = {
        "cv": cv_tables, "kinds": {k: {"regret": v} for k, v in kind_regret.items()},
        "chosen_by": f"the policy's {by} regret", "feature_set": features,
        "policy": {**policy.to_dict(), "chosen_by": f"{by} regret"},
        "rows": len(rows), "records": len(records), "students": sorted({r["student"] for r in rows}),
        "sources": sorted({r["source"] for r in rows}),
        "labels": {s: sum(r["label"] == s for r in rows) for s in options_in(rows)}, "ties": sum(r["tie"] for r in rows),
        "tie_margin": tie_margin, "rule_of_thumb": vars(Rule.fit(rows)),
        "lab_prior": fit_lab_prior(rows),
        "params_range": [min(r["n_params"] for r in rows), max(r["n_params"] for r in rows)],
        **({"probe": {"steps": recipe["steps"], "eval_problems": recipe["eval_problems"]}} if recipe else {}),
        **({"recipe": recipe} if recipe and "kind" in recipe else {}),
        **({"note": settings.note} if settings.note else {}),
        # absent at the default, so files from before read as they did
        **({"cv_members": cv_members} if cv_members != CV_MEMBERS else {}),
        **({"gate_draws": draws, "draw_gates": [g.to_dict() if g else None for g in alone]} if draws != 1 else {}),
        **({"record_files": list(files)} if files else {}),
        **({"own_sources": own} if own else {}),
        **({"policy_own": {**policy_own.to_dict(), "chosen_by": "leave-one-proxy-target-out regret"}}
           if policy_own else {}),
        **({"proxy_rule": {**choose_rule(rows).to_dict(), "chosen_by": "regret of every source's large students, "
                                                                         "each advised from its own source's proxies"}}
           if policy_own else {}),
        "races": race_summary(records),
    }
    pred.save(out)
    return {"cv": compact(cv_tables), "chosen": chosen, "kinds": pred.meta["kinds"], "policy": pred.meta["policy"],
            "rows": len(rows), "labels": pred.meta["labels"], "ties": pred.meta["ties"],
            "rule_of_thumb": pred.meta["rule_of_thumb"], "out": str(out),
            **({"draw_gates": pred.meta["draw_gates"]} if "draw_gates" in pred.meta else {}),
            **({"own_sources": sorted(own), "policy_own": pred.meta["policy_own"]} if policy_own else {})}


CV_KEYS = ("regret", "decision_accuracy", "rows")
# measured since tables stated the flip rate; a table stored before has none of them
CV_SEED_KEYS = ("flip_rate", "flip_cells", "p_low_spread")
# measured since the policy gained its gate: the race's cost, the stricter judgments, the sources
CV_GATE_KEYS = ("overhead", "other_seed", "other_half", "cap", "caps")
# measured since the tables reported as TuneAhead does, and what a user whose gate opens pays
CV_SHARE_KEYS = ("within_3_points", "opened", "overhead_where_open", "race_every_pool", "compute_saved")
# measured since the tables counted tokens: the same extra training in tokens (`gate.in_tokens`)
CV_TOKEN_KEYS = ("overhead_tokens", "overhead_tokens_where_open", "tokens_unknown")


def compact(cv_tables: dict) -> dict:
    """{split: {method: {"regret": points, "decision_accuracy": share, "rows": n, "flip_rate": share
    of cells whose seeds got different advice, "flip_cells": n, "p_low_spread": P(D_low)'s mean
    range across seeds (policy and predictor), on the proxy split "by_source": the same per pool source}}}"""
    return {split: {m: {k: t["methods"][m][k] for k in (*CV_KEYS, *CV_SEED_KEYS, *CV_GATE_KEYS, *CV_SHARE_KEYS, *CV_TOKEN_KEYS,
                                                                    "by_source")
                        if k in t["methods"][m]}
                    for m in CV_METHODS if m in t["methods"]}
            for split, t in cv_tables.items()}


def fit_file(records_path, out: str, settings, log=None) -> dict:
    """`advisor fit`: the settings (`FitSettings`) checked, the records (one file, several, or
    the records store) read and checked, the predictor fitted (`fit_and_save`) and saved to OUT."""
    settings.check()
    check_writable_dir(out, "--out")
    paths = [records_path] if isinstance(records_path, str) else list(records_path or ())
    records, files = record_files(paths or [str(advisor_home() / "records.jsonl")])
    repeated = sum(f.get("repeated", 0) for f in files)
    if repeated and log:
        log(f"dropped {repeated} repeated record{'s' if repeated > 1 else ''} ("
            + ", ".join(f"{f['repeated']} in {f['file']}" for f in files if f.get("repeated"))
            + "): each run counts once")
    result = fit_and_save(records, out, settings, log=log, files=files)
    return {**result, "repeated_records": repeated} if repeated else result
