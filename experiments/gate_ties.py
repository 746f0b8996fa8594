"""How steady is the gate's choice? The gate `advisor fit` ships is the lowest held-out regret of
its grid, measured on one bootstrap draw of the held-out fits (or, with `--gate-draws`, on several
pooled). This measures the held-out predictions of the chosen kind on DRAWS draws, and prints:

- the gate each draw alone chooses (its own thresholds, as `advisor fit --seed S` would), the gate
  each half of the draws pooled chooses (as `--gate-draws DRAWS/2` at two seeds would) and all
  of them pooled, with its held-out regret and mean overhead;
- the gates within `--near` points of the best over all draws pooled, within the cap: how many,
  and the range of their overhead (what the held-out split cannot tell apart);
- with FOLDERS, each distinct gate chosen above put in place of the predictor's own (`--predictor`,
  default the shipped one: its P(D_low) and policy unchanged) and judged on rows it was never
  fitted on (`experiments.transfer`: regret and extra training at the schedule's evaluations and
  at the race's own shares), and the range of that judgment over every gate within `--near` of
  the best.

With `--bar`, also every gate of the grid judged on FOLDERS against the real-student bar (mean
extra training within the cap at the race's shares, no pool source above always-high, half of
always-high's loss recovered where D_low wins): how many meet it, and where the held-out split puts
the best of them.

With `--cheapest`, each choice is instead the gate of least mean overhead within `--near` points
of the best (a tie-break by cost among the gates the split cannot tell apart).

    python -m experiments.gate_ties --records calibration/records.jsonl --draws 6 --scout \\
        calibration/lab2/digitsum-explore calibration/lab2/subtraction-explore \\
        calibration/lab2/digitsum-program calibration/lab2/subtraction-program

Seconds to a few minutes on one CPU core (the held-out fits dominate: DRAWS × one per pool source).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from statistics import mean

from capacity_advisor.advisor.predictor import label_rows, read_records
from capacity_advisor.advisor.predictor.evaluate import regret
from capacity_advisor.advisor.predictor.gate import CAP, NO_SCOUT, RACE_GRIDS, SCOUTS, scored_gates
from capacity_advisor.advisor.predictor.labels import FEATURE_SETS, TIE_MARGIN
from capacity_advisor.advisor.predictor.members import FITTABLE
from capacity_advisor.advisor.predictor.policy import choose_policy, fold_measurements, with_gate
from capacity_advisor.advisor.predictor.races import with_curves
from capacity_advisor.core.errors import InputError

SPLIT = "source"  # the split `advisor fit` chooses its gate by (CHOOSE_BY)


def choice(measured: list[dict], races: tuple, scouts: tuple, cheapest: float | None = None) -> tuple:
    """(gate, regret in points, mean overhead) that `advisor fit` would choose on `measured`; with
    `cheapest`, the gate of least mean overhead among those within that many points of the best
    (near-ties to the lower regret, then the more cautious)."""
    policy = choose_policy(measured)
    if cheapest is not None:
        scored = [(g, 100 * reg, over) for g, reg, over, _ in scored_gates(measured, policy, races=races, scouts=scouts)
                  if over <= CAP + 1e-9]
        best = min(r for _, r, _ in scored)
        return min(((g, r, o) for g, r, o in scored if r <= best + cheapest + 1e-9),
                   key=lambda t: (round(t[2], 9), t[1], -t[0].threshold, -t[0].headroom, -t[0].scout))
    gate = with_gate(policy, measured, races=races, scouts=scouts).gate
    for g, reg, over, _ in scored_gates(measured, policy, races=races, scouts=scouts):
        if g.rule == gate.rule and (g.threshold, g.headroom, g.scout, g.high_scout) == (
                gate.threshold, gate.headroom, gate.scout, gate.high_scout):
            return gate, 100 * reg, over
    raise AssertionError("the chosen gate is not in the grid")


def near_best(scored: list[tuple], near: float) -> dict:
    """The gates within `near` points of the best held-out regret among `scored` (`scored_gates`'s
    tuples), within the cap."""
    capped = [(g, 100 * reg, over) for g, reg, over, _ in scored if over <= CAP + 1e-9]
    best = min(r for _, r, _ in capped)
    close = [(g, r, o) for g, r, o in capped if r <= best + near + 1e-9]
    return {"best": best, "gates": len(close), "of": len(capped), "close": [g for g, *_ in close],
            "overhead": (min(o for *_, o in close), max(o for *_, o in close)),
            "regret": (min(r for _, r, _ in close), max(r for _, r, _ in close))}


def every_gate_there(records: list[dict], predictor_dir: str | None, races: tuple, scouts: tuple):
    """(gate, [(row, kept set, overhead), ...]) for every gate of the grid on the records' rows, each
    gate in place of the predictor's as `experiments.transfer` judges it at the race's shares: the
    policy's decision is made once per row (`Policy.decide`, gate left out), then each gate's scout,
    opening and race are applied as `Policy.decide` applies them."""
    from dataclasses import replace

    from capacity_advisor.advisor.predictor import Policy
    from capacity_advisor.advisor.predictor.gate import HEADROOM_INPUT, grid, headroom_of
    from capacity_advisor.advisor.probe.plan import load_predictor

    predictor = load_predictor(predictor_dir)
    policy = replace(Policy.of(predictor), gate=None)
    rows = with_curves(label_rows(records), records)
    seen = []
    for r in rows:
        d = policy.decide(predictor, r["features"], r["n_params"], r["budget"], r["score"], student=r["student"])
        seen.append((r, d.strategy, d.advice.probabilities.get("low", float("nan")), headroom_of(r), r["features"]))
    replays: dict = {}
    for g in grid(races, scouts):
        picks = []
        for r, strategy, p_low, head, feats in seen:
            if g.scouts(feats):
                picks.append((r, "low", 0.0))
            elif g.opens(p_low, {HEADROOM_INPUT: head}):
                if g.scouts_high(feats):
                    picks.append((r, "high", 0.0))
                else:
                    key = (id(r), g.rule)
                    if key not in replays:
                        replays[key] = g.replay(r, at_shares=True)
                    picks.append((r, *replays[key]))
            else:
                picks.append((r, strategy, 0.0))
        yield g, picks


def meets_bar(picks: list[tuple], cap: float = CAP) -> bool:
    """The real-student bar: mean overhead within `cap`, no pool source above always-high, and on
    every source where D_low wins (its mean accuracy above D_high's by more than the tie margin)
    at least half of always-high's loss recovered."""
    if mean(o for *_, o in picks) > cap + 1e-9:
        return False
    for s in {r["source"] for r, *_ in picks}:
        sub = [(r, c) for r, c, _ in picks if r["source"] == s]
        mine, high = mean(regret(r, c) for r, c in sub), mean(regret(r, "high") for r, _ in sub)
        low_wins = mean(r["accuracy"]["low"] - r["accuracy"]["high"] for r, _ in sub) > TIE_MARGIN
        if mine > high + 1e-9 or (low_wins and mine > high / 2 + 1e-9):
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.gate_ties", description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="*", help="published calibrations to judge each chosen gate on")
    ap.add_argument("--records", required=True, help="the records the gate is chosen on (what `advisor fit` took)")
    ap.add_argument("--draws", type=int, default=6, help="bootstrap draws of the held-out fits (seeds 0, 1, …)")
    ap.add_argument("--kind", default="lightgbm", choices=FITTABLE, help="the model kind (the shipped fit's)")
    ap.add_argument("--cv-members", type=int, default=8, help="members of each held-out fit (`advisor fit`'s)")
    ap.add_argument("--features", default="contrast", choices=tuple(FEATURE_SETS), help="the inputs (`advisor fit`'s)")
    ap.add_argument("--scout", action="store_true", help="offer the gate a scout, as `advisor fit --scout`")
    ap.add_argument("--race-grid", default="fixed", choices=tuple(RACE_GRIDS))
    ap.add_argument("--near", type=float, default=0.05, help="points from the best that count as a tie")
    ap.add_argument("--cheapest", action="store_true",
                    help="choose, instead of the lowest regret, the cheapest gate within --near points of it")
    ap.add_argument("--bar", action="store_true",
                    help="with FOLDERS, also count the grid's gates that meet the bar there (mean extra training within "
                         "the cap, no source above always-high, half of its loss recovered where D_low wins) and say "
                         "what the best of them loses held out")
    ap.add_argument("--elsewhere", default="",
                    help="with --bar: comma-separated folders on which the best gate that meets the bar is also judged, "
                         "beside the predictor's own gate")
    ap.add_argument("--predictor", default=None, help="whose P(D_low) the gates are judged with (default: shipped)")
    args = ap.parse_args(argv)
    if not (2 <= args.draws <= 16 and 1 <= args.cv_members <= 256 and args.near >= 0):
        print("error: --draws must be 2 to 16, --cv-members 1 to 256 and --near at least 0", file=sys.stderr)
        return 2
    races, scouts = RACE_GRIDS[args.race_grid], SCOUTS if args.scout else NO_SCOUT
    try:
        recs = read_records(args.records)
        rows = with_curves(label_rows(recs, tie_margin=TIE_MARGIN), recs)
        if args.folders:
            from experiments.transfer import AT_SHARES, judge
            from experiments.transfer import read_records as read_folders

            missing = [p for p in (*args.folders, *args.elsewhere.split(",")) if p and not Path(p).exists()]
            if missing:
                raise InputError(f"{', '.join(missing)[:300]} does not exist: name published calibrations (calibration/...)")
            unseen = read_folders(args.folders)
            elsewhere = read_folders([p for p in args.elsewhere.split(",") if p]) if args.bar else []
            if not unseen or (args.bar and args.elsewhere and not elsewhere):
                raise InputError("the folders hold no records to judge the gates on: name published calibrations")
        measured = fold_measurements(rows, SPLIT, args.kind, FEATURE_SETS[args.features], args.cv_members, 0, 1,
                                     args.draws)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    half = args.draws // 2
    sets = {**{f"draw {d} alone": [m for m in measured if m["draw"] == d] for d in range(args.draws)},
            f"draws 0–{half - 1} pooled": [m for m in measured if m["draw"] < half],
            f"draws {half}–{args.draws - 1} pooled": [m for m in measured if m["draw"] >= half],
            f"all {args.draws} draws pooled": measured}
    print(f"{len(rows)} rows of {args.records}, held out by {SPLIT}, {args.kind}, {args.cv_members} members a fit\n")
    rule = f"the cheapest within {args.near:g} points of the best" if args.cheapest else "the lowest regret"
    print(f"| held-out measurements | gate chosen ({rule}) | regret | mean overhead |\n|---|---|---|---|")
    chosen = {}
    for name, ms in sets.items():
        gate, reg, over = choice(ms, races, scouts, args.near if args.cheapest else None)
        key = gate.describe()
        chosen.setdefault(key, (len(chosen), gate))
        print(f"| {name} | {chr(65 + chosen[key][0])} | {reg:.2f} | {over:.0%} |")
    print()
    for key, (i, _) in chosen.items():
        print(f"{chr(65 + i)}: {key}")
    scored = list(scored_gates(measured, choose_policy(measured), races=races, scouts=scouts))  # all draws pooled
    nb = near_best(scored, args.near)
    print(f"\nOn all {args.draws} draws pooled, {nb['gates']} of the {nb['of']} gates within the {CAP:.0%} cap lie "
          f"within {args.near:g} points of the best ({nb['best']:.2f}): regret {nb['regret'][0]:.2f}–"
          f"{nb['regret'][1]:.2f}, mean overhead {nb['overhead'][0]:.0%}–{nb['overhead'][1]:.0%}.")
    if args.folders:
        print(f"\nEach gate with the predictor's P(D_low), judged on {', '.join(args.folders)}:\n")
        print("| gate | regret, at the schedule's evaluations | extra training | at its shares | extra training "
              "| always high |\n|---|---|---|---|---|---|")
        for key, (i, gate) in chosen.items():
            t = judge(unseen, args.predictor, gate=gate)["methods"]
            a, s, h = t["gated race (shipped)"]["all"], t[AT_SHARES]["all"], t["always high"]["all"]
            print(f"| {chr(65 + i)} | {a['regret']:.2f} | {a['overhead']:.0%} | {s['regret']:.2f} | {s['overhead']:.0%} "
                  f"| {h['regret']:.2f} |")
        # every gate the held-out split cannot tell from the best, judged the same way
        got = [judge(unseen, args.predictor, gate=g)["methods"][AT_SHARES]["all"] for g in nb["close"]]
        lo, hi = (f(got, key=lambda a: (round(a["regret"], 9), a["overhead"])) for f in (min, max))
        print(f"\nThe {len(got)} gates within {args.near:g} points of the best, judged there at their shares: regret "
              f"{lo['regret']:.2f} (at {lo['overhead']:.0%}) to {hi['regret']:.2f} (at {hi['overhead']:.0%}); "
              f"extra training {min(a['overhead'] for a in got):.0%}–{max(a['overhead'] for a in got):.0%}.")
    if args.folders and args.bar:
        held = {g: (100 * reg, over) for g, reg, over, _ in scored}
        meeting = [(held[g], g, picks)
                   for g, picks in every_gate_there(unseen, args.predictor, races, scouts) if meets_bar(picks)]
        capped = sorted((t for t in meeting if t[0][1] <= CAP + 1e-9), key=lambda t: (t[0][0], t[0][1]))
        print(f"\n{len(meeting)} of the grid's gates meet the bar on the folders (mean extra training within {CAP:.0%} "
              f"at their shares, no source above always-high, half of its loss recovered where D_low wins); "
              f"{len(capped)} of them are within the cap held out.")
        if capped:
            (reg, over), g, picks = capped[0]
            print(f"The best of them held out loses {reg:.2f} at {over:.0%} on all {args.draws} draws pooled (the best "
                  f"gate: {nb['best']:.2f}); there it loses {100 * mean(regret(r, c) for r, c, _ in picks):.2f} at "
                  f"{mean(o for *_, o in picks):.0%}: {g.describe()}.")
            if elsewhere:
                mine = judge(elsewhere, args.predictor, gate=g)["methods"][AT_SHARES]["all"]
                own = judge(elsewhere, args.predictor)["methods"][AT_SHARES]["all"]
                print(f"On {args.elsewhere}, at their shares: it loses {mine['regret']:.2f} at {mine['overhead']:.0%}, "
                      f"the predictor's own gate {own['regret']:.2f} at {own['overhead']:.0%}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
