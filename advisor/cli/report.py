"""Everything the CLI prints: rich tables on stderr for people (JSON goes to stdout via `ui.emit_json`).

Library functions return values; these render them.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.panel import Panel
from rich.table import Table

from capacity_advisor.advisor.cli.ui import console, fmt, kv_table
from capacity_advisor.advisor.predictor import SIZE_RULE
from capacity_advisor.advisor.predictor.gate import Gate
from capacity_advisor.advisor.recommendation.draws import race_headline
from capacity_advisor.training.manifest import SETS


def pool(p) -> None:
    """The pool as read: its layout, the fields detected, what was kept and what skipped."""
    console.print(pool_table(p.summary(), p.source, p.skipped_examples))


def pool_table(s: dict, source=None, examples: dict | None = None):
    rows = {"pool": source or s["source"], "layout": s["layout"],
            "fields": ", ".join(f"{k} = {v}" for k, v in (s.get("fields") or {}).items() if v) or "—",
            "problems": s["problems"], "candidates": s["candidates"], "per problem": s["candidates_per_problem"],
            "with answers": s["with_answers"]}
    if s.get("sampled"):
        rows["sampled"] = f"{s['sampled']} problems (--sample)"
    if s["skipped_candidates"]:
        rows["skipped candidates"] = s["skipped_candidates"]
    if s["skipped_problems"]:
        rows["skipped problems"] = s["skipped_problems"]
        if examples:
            rows["e.g."] = "; ".join(f"{k}: {', '.join(v)}" for k, v in examples.items())
    return kv_table("Pool", rows)


def waiting(verb: str, summary: dict, rank: int, size: int, written) -> None:
    """A data-parallel rank that finished its shards while others still work."""
    console.print(f"rank {rank}/{size}: {verb} {summary['computed']} shard(s); {len(summary['waiting_for'])} of "
                  f"{summary['shards']} shards are still with other ranks. The last rank to finish writes {written}"
                  + ("; rerun with --dp-size 1 to do what is missing and write it here." if verb == "scored" else "."))


def compute(c: dict) -> None:
    console.print(f"compute-responsive: {c['classes']} (budgets {c['short']} and {c['long']} new tokens); "
                  f"wrote {c['written']}")


def scores(summary: dict, backend: str) -> None:
    m = summary["model"]
    console.print(kv_table("Scores", {
        "model": f"{m['spec']} ({m['architecture']}, {m['n_params']:,} params, {m['dtype']})",
        "backend": backend, "template": summary["template"], "candidates": summary["candidates"],
        "response tokens": summary["response_tokens"], "truncated": summary["truncated"],
        "reused from cache": summary["from_cache"], "seconds": summary["seconds"], "written": summary["scores"],
    }))
    if summary.get("chosen"):  # what the backend picked itself (vllm: its engine's settings)
        settings(summary["chosen"])


def selection(s: dict, strategy: str, score_kind: str, out: str, fmt_name: str) -> None:
    console.print(kv_table(f"Selection: {strategy}", {
        "problems": s["problems"], "rows": s["rows"], "rows from the low set": s["rows_from_low"],
        f"log-prob ({score_kind}), high set": s["mean_score_high"],
        f"log-prob ({score_kind}), low set": s["mean_score_low"],
        "likelihood gap (high - low)": s["likelihood_gap"],
        "likelihood gap per token": s["likelihood_gap_per_token"],
        "length ratio (low / high tokens)": s["length_ratio_low_high"],
        "trigram repetition, high / low set": _pair(s.get("trigram_repetition_high"), s.get("trigram_repetition_low")),
        "problems where high = low": s["same_candidate"],
        "response starts, high set": _cues(s.get("start_cues_high")),
        "response starts, low set": _cues(s.get("start_cues_low")), "written": f"{out} ({fmt_name})",
    }))


def _pair(high, low) -> str:
    """Two shares as "0.46 / 0.21" ("—" for one a set cannot have: no response of three words)."""
    return " / ".join("—" if v is None or v != v else f"{v:.2f}" for v in (high, low))


def _cues(cues) -> str:
    return ", ".join(f"{text!r} {share:.0%}" for text, share in cues or []) or "—"


def generated(summary: dict, out: str) -> None:
    t = summary["teacher"]
    rows = {"teacher": f"{t['spec']} ({t['architecture']}, {t['n_params']:,} params, {t['dtype']})",
            "backend": summary["backend"], "problems": summary["problems"], "generations": summary["generations"],
            "mean tokens": summary["mean_tokens"], "unfinished (hit --max-new-tokens)": summary["unfinished"],
            "checker": summary["checker"]}
    if summary["correct"] is not None:
        rows["correct"] = f"{summary['correct']} ({summary['correct'] / max(1, summary['generations']):.1%})"
        rows["problems with >= 2 correct"] = summary["problems_with_two_correct"]
    rows.update({"reused from cache": f"{summary['from_cache']} problems", "seconds": summary["seconds"], "written": out})
    console.print(kv_table("Generated pool", rows))
    if summary.get("chosen"):
        settings(summary["chosen"])


def probe(report: dict, out: str) -> None:
    curves = report["curves"]
    t = Table(title=f"Probe: {report['model']['spec']} ({report['model']['n_params']:,} params)", title_justify="left")
    t.add_column("metric")
    for s in curves:
        t.add_column(f"D_{s}: start → end", justify="right")
    for key in ("train_loss", "teacher_nll", "teacher_nll_low", "answer_logprob", "accuracy", "answer_rate",
                "repetition_rate", "copy_rate", "finish_rate", "base_drift", "teacher_view"):
        vals = [(c[0].get(key), c[-1].get(key)) for c in curves.values()]
        if all(a is None and b is None for a, b in vals):
            continue
        t.add_row(key, *[f"{fmt(a)} → {fmt(b)}" for a, b in vals])
    console.print(t)
    if report.get("chosen"):
        settings(report["chosen"])
    for line in report.get("notes") or []:
        console.print(f"[bold]measured[/bold]: {line}", highlight=False)
    c = report["cost"]
    share = c["share_of_full_run"]
    line = f"probe cost: {probe_tokens(c)}"
    if share:
        line += (" = " + ", ".join(f"{100 * v:.1f}% of a {e}-epoch full run's training tokens" for e, v in share.items())
                 + training_alone(c, [int(e) for e in share]))
    console.print(line + f"; checker {report.get('checker', '—')}. Wrote {Path(out) / 'probe.json'} and probe.png.")


def probe_tokens(cost: dict) -> str:
    """The probe's tokens, trained, generated and scored apart: a generated or scored token is not
    a trained one."""
    generated = cost.get("probe_generated_tokens")
    if generated is None:  # a report from before generated tokens were counted apart
        return (f"{cost['probe_tokens']:,} tokens ({cost['probe_train_tokens']:,} trained + "
                f"{cost['probe_eval_tokens']:,} read by its evaluations)")
    return (f"{cost['probe_tokens']:,} tokens ({cost['probe_train_tokens']:,} trained, {generated:,} generated, "
            f"{cost['probe_eval_tokens'] - generated:,} more read to score its evaluations)")


def training_alone(cost: dict, budgets: list[float]) -> str:
    """The probe's trained tokens (and with what it generated) against the full run's trained
    tokens: the like-for-like shares."""
    per_epoch = cost.get("full_run_tokens_per_epoch")
    if not per_epoch:
        return ""
    shares = ", ".join(f"{cost['probe_train_tokens'] / (per_epoch * b):.1%}" for b in budgets)
    generated = cost.get("probe_generated_tokens")
    if generated is None:
        return f" (its training alone: {shares})"
    work = ", ".join(f"{(cost['probe_train_tokens'] + generated) / (per_epoch * b):.1%}" for b in budgets)
    return f" (its training and generation: {work}; its training alone: {shares})"


def settings(chosen: dict) -> None:
    t = Table(title="Settings chosen (and where from)", title_justify="left", show_header=False)
    for k, s in chosen.items():
        t.add_row(k, fmt(s["value"]), s["source"])
    console.print(t)


def cross_validation(result: dict) -> None:
    pol = result.get("policy") or {}
    console.print(f"kind: {result['chosen']}; policy: predictor trusted up to {pol.get('max_distance')}x the typical "
                  f"distance, margin {pol.get('margin')}, range check {'on' if pol.get('use_range') else 'off'}; "
                  f"{result['rows']} rows, labels {result['labels']}, near-ties {result['ties']}", highlight=False)
    if pol.get("race"):
        gate = Gate.from_dict(pol["race"])
        counted = " in tokens" if gate.cost == "tokens" else ""
        console.print(f"gate: the policy {gate.describe()} (chosen within {gate.cap:.0%} mean extra training{counted})",
                      highlight=False)
        alone = result.get("draw_gates") or []
        if alone:  # --gate-draws: the pooled choice beside what each draw alone would have chosen
            same = sum(g == pol["race"] for g in alone)
            console.print(f"chosen over {len(alone)} bootstrap draws pooled; {same} of them alone (choosing their own "
                          "thresholds, the kind kept) would have chosen the same gate", highlight=False)
    if result.get("own_sources"):
        own = result["policy_own"]
        console.print(f"your own pool sources: {', '.join(result['own_sources'])}; on them the predictor is trusted up "
                      f"to {own.get('max_distance')}x the typical distance, margin {own.get('margin')}, range check "
                      f"{'on' if own.get('use_range') else 'off'} (chosen on the proxy split)", highlight=False)
    for split, methods in result["cv"].items():
        t = Table(title="A large student on its own pool source, with that source's small students in the fit"
                  if split == "proxy" else f"Leave one {split} out", title_justify="left")
        for col in ("method", "regret (points)", "decision accuracy", "extra training", "rows", "flip rate",
                    "P(D_low) spread"):
            t.add_column(col, justify="left" if col == "method" else "right")
        for name, row in sorted(methods.items(), key=lambda kv: kv[1]["regret"] if kv[1]["regret"] is not None else 1e9):
            mark = " ← shipped" if name == "gated race" or (name == "policy" and "gated race" not in methods) else ""
            t.add_row(name + mark, _num(row["regret"], ".2f"), _num(row["decision_accuracy"], ".3f"),
                      _num(row.get("overhead", 0.0), ".0%"), str(row["rows"]), _num(row.get("flip_rate"), ".3f"),
                      _num(row.get("p_low_spread"), ".3f"))
        console.print(t)
    console.print("flip rate: the share of (student, source, ranking, budget) cells whose seeds (pool draw, data "
                  "order) got different held-out advice; 0 by construction for the constant rules and the size rule. "
                  "P(D_low) spread: its mean range across a cell's seeds. Extra training: the gated race's mean "
                  "overhead (the losing set's training where its gate opened, as a share of one run).", highlight=False)


def calibration_plan(c: dict) -> None:
    """What `calibrate --students` runs (or would run, with --dry-run) and what it costs."""
    t = Table(title=f"Calibration on your pool: {c['train_problems']:,} problems to train on, {c['eval_problems']} held "
                    f"out, {c['epochs']:g} epochs, seeds {','.join(map(str, c['seeds']))}", title_justify="left")
    for col in ("proxy", "parameters", "probe steps x batch", "full runs", "steps per run", "batch", "sequences",
                "evaluations per run", "learning rate"):
        t.add_column(col, justify="left" if col == "proxy" else "right")
    for s in c["students"]:
        t.add_row(s["student"], f"{s['n_params']:,}", f"{s['probe_steps']} x {s['probe_batch']}", str(s["runs"]),
                  f"{s['full_run_steps']:,}", str(s["train_batch"]), f"{s['sequences']:,}", str(s["evaluations_per_run"]),
                  f"{s['learning_rate']:g}")
    console.print(t)
    if c.get("target"):
        tg = c["target"]
        console.print(f"cost: {tg['share_of_one_full_run']:.1%} of one {c['epochs']:g}-epoch full run of {tg['model']} "
                      f"({tg['n_params']:,} parameters; compute as parameters x sequences trained)", highlight=False)
    if c.get("gpu"):
        gpu_plan(c)


def _tokens(x: float) -> str:
    """A token count in words a table can hold: 1.23M, 4.5B."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= size:
            return f"{x / size:.3g}{unit}"
    return f"{x:.0f}"


def _hours(h: float) -> str:
    return f"{h:,.0f}" if h >= 100 else f"{h:.1f}" if h >= 1 else f"{h:.2g}"


def gpu_plan(c: dict) -> None:
    """The dry run's measured tokens and what they cost in GPU-hours, with the assumptions stated."""
    g = c["gpu"]
    t = Table(title=f"GPU-hours on one GPU of {g['peak_tflops']:g} peak TFLOP/s at MFU {g['mfu']:g} (training, forward "
                    f"passes) and {g['decode_mfu']:g} (generation): computed from measured token counts, not measured on a GPU",
              title_justify="left")
    for col in ("model", "tokens / sequence", "tokens / epoch of a set", "trained", "forward", "generated (at most)",
                "GPU-h train", "GPU-h forward", "GPU-h generate", "GPU-h total"):
        t.add_column(col, justify="left" if col == "model" else "right")
    rows = [(s["student"], s) for s in c["students"]]
    if c.get("target"):
        rows.append((f"{c['target']['model']} (target, one full run)", c["target"]))
    missing, notes = [], []
    for name, row in rows:
        if "compute" not in row:
            t.add_row(name, *["—"] * 9)
            missing.append(f"{name}: {row.get('tokens_missing', 'not measured')}")
            continue
        k, h = row["tokens"], row["compute"]["gpu_hours"]
        t.add_row(name, f"{k['sequence_mean']:,.0f}",
                  f"{_tokens(k['per_epoch'])} ({_tokens(k['per_epoch_shortest'])}–{_tokens(k['per_epoch_longest'])})",
                  _tokens(row["compute"]["train_tokens"]), _tokens(row["compute"]["forward_tokens"]),
                  _tokens(row["compute"]["generated_tokens"]),
                  *(_hours(h[part]) for part in ("train", "forward", "generate", "total")))
        if row.get("tokens_missing"):
            notes.append(f"note — {name}: {row['tokens_missing']}")
    console.print(t)
    lines = ["FLOPs: training 6·N·tokens (forward and backward), forward passes (scoring every candidate, the "
             "evaluations' teacher-forced passes) 2·N·tokens, generation 2·N·tokens; GPU-hours = FLOPs / (peak × MFU) "
             "/ 3600. Peak and MFU are assumptions: set --gpu-tflops, --mfu and --decode-mfu for your cluster "
             "(generation, one token at a time, runs far below training's MFU).",
             "A set's tokens per epoch: each problem's mean over its candidates, summed over problems (D_high, D_low and "
             "D_mixed each hold one response per problem, chosen by the student's scores, which a dry run does not "
             "have); in brackets every problem's shortest and longest candidate. Generations are counted at "
             "--max-new-tokens each, an upper bound."]
    if g.get("proxies_gpu_hours") is not None:
        share = f" ({g['share_of_one_full_run']:.0%} of the target's one full run)" if "share_of_one_full_run" in g else ""
        lines.append(f"all proxies: {_hours(g['proxies_gpu_hours'])} GPU-hours{share}")
    lines += notes + [f"not measured — {m}" for m in missing]
    for line in lines:
        console.print(line, highlight=False)


def _num(value, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def chooses_among(options) -> str:
    """The options the advice was calibrated on, in words, saying so when no schedule was."""
    words = ", ".join(f"D_{o}" if o in SETS else o for o in options)
    if all(o in SETS for o in options):
        words += " only (no mixes of other shares or curricula were calibrated)"
    return words


def headline(rec) -> str:
    """The report's panel: the race the recommendation plans, if any, then the set, who answered,
    what it chooses among, the student and budget, and the predicted crossover."""
    m = rec.model
    how = rec.schedule.describe()
    head = ""
    if rec.race:
        head = f"[bold]{race_headline(rec.race)}[/bold]\nwhy a race: {rec.race['why']}\n"
    head += (f"[bold]{'Without the race, train' if rec.race else 'Train'} on: D_{rec.strategy}[/bold]"
             + (f" ({how})" if how else "")
            + (" — the evidence is silent here; mixed is the hedge" if rec.answer == "uncertain" else "")
            + f"   confidence: {rec.confidence}   ({rec.predictor})\n"
            + f"answered by: {rec.answered_by}\n"
            + f"chooses among: {chooses_among(rec.options)}\n"
            + f"student {m['spec']} ({m['n_params']:,} params), budget {rec.budget:g} epochs")
    co = rec.crossover_epoch
    alone = "" if rec.answered_by in ("predictor",) or rec.prior else "the predictor alone: "
    head += (f"\n{alone}predicted crossover: D_low overtakes D_high from about epoch " + f"{co:g}") if co else \
        f"\n{alone}predicted crossover: none within 10 epochs (D_high stays ahead)"
    return head


def recommendation(rec, out: str) -> None:
    """The recommend report: the answer, its probabilities and interval, why, where the student
    sits among the calibrated ones, what the rules would say, the settings and their sources, the
    pool as read, and what was written."""
    console.print(Panel(headline(rec), title="capacity-advisor", expand=False))
    t = Table(title="Probabilities" + (" (10-90% interval over the ensemble)" if rec.interval else ""),
              title_justify="left")
    for s in rec.probabilities:
        t.add_column(f"D_{s}", justify="right")
    iv = rec.interval or {}
    t.add_row(*[f"{p:.2f}" + (f" ({iv[s][0]:.2f}-{iv[s][1]:.2f})" if s in iv else "") for s, p in rec.probabilities.items()])
    console.print(t)
    for line in rec.confidence_reasons:
        console.print(f"[bold]confidence[/bold]: {line}", highlight=False)
    if rec.draws:
        agree = len({d["strategy"] for d in rec.draws}) == 1
        t = Table(title=f"Probe draws ({'they agree' if agree else 'they disagree'}; the advice reads their averaged inputs)",
                  title_justify="left")
        for col in ("seed", "advice alone", "answered by", *(f"P(D_{o})" for o in rec.probabilities), "folder"):
            t.add_column(col)
        for d in rec.draws:
            t.add_row(str(d["seed"]), f"D_{d['strategy']}", d["answered_by"],
                      *[f"{d['probabilities'].get(o, float('nan')):.2f}" for o in rec.probabilities], f"{out}/{d['probe']}")
        console.print(t)
    if rec.policy:
        console.print(f"[bold]policy[/bold]: {rec.policy}", highlight=False)
    if rec.reasons:
        console.print("[bold]Why[/bold]: " + "; ".join(rec.reasons), highlight=False)
    if rec.neighbours:
        t = Table(title="Nearest calibrated students (what they measured at this budget)", title_justify="left")
        for col in ("student", "pool source", "ranking", "distance", "best", "high", "low", "mixed"):
            t.add_column(col)
        b = rec.calibrated_budget
        for n in rec.neighbours:
            o = n.get("outcomes", {}).get(b, {})
            t.add_row(n["student"], str(n.get("source") or n["task"]), str(n["score"]), f"{n['distance']:.2f}", o.get("label", "—"),
                      *[fmt(o.get(s)) for s in ("high", "low", "mixed")])
        console.print(t)
    outside = [r for r in (rec.range or []) if r["inside"] is False]
    if outside:
        console.print("[bold]outside the calibrated range[/bold]: " + ", ".join(
            f"{r['feature']} = {r['value']:.3g} ({r['min']:.3g} to {r['max']:.3g})" for r in outside), highlight=False)
    if rec.paper_prior:
        pp = rec.paper_prior
        console.print(f"[bold]the paper, for students of this size[/bold]: {pp['answer']} — {pp['confidence_reasons'][0]}")
    t = Table(title="What the rules would say", title_justify="left", show_header=False)
    for rule, choice in rec.baselines.items():
        t.add_row(rule, choice + (f" ({rec.rule_of_thumb})" if rule == SIZE_RULE and rec.rule_of_thumb else ""))
    console.print(t)
    settings(rec.settings)
    if rec.pool is not None:
        console.print(pool_table(rec.pool))
    for line in rec.notes:
        console.print(f"[bold]note[/bold]: {line}", highlight=False)
    written(rec, out)


def race_tokens(t: dict | None) -> str:
    """The race's extra training in tokens: D_low's sequences are often several times D_high's, so the
    same share of the budget costs far more where D_high is kept."""
    if not t:
        return ""
    return (f"; in tokens, up to {t['keep_high']:.0%} of a D_high run where D_high is kept (D_low's sequences are "
            f"{t['ratio']:.1f}x D_high's here) and {t['keep_low']:.0%} of a D_low run where D_low is kept")


def written(rec, out: str) -> None:
    """The report's last lines: where the race's figures come from, the compute spent, what was
    written and what to run next."""
    spent = f"{rec.seconds}s"
    cost = rec.probe_cost
    if cost:
        spent += f"; probe {probe_tokens(cost)}"
        share = rec.probe_share
        if share is not None:
            spent += f" = {share:.1%} of the {rec.budget:g}-epoch full run's training tokens" + training_alone(cost, [rec.budget])
    if rec.race and rec.race.get("expected"):
        extra = rec.race.get("wait") or rec.race["fraction"]
        console.print(f"[bold]race[/bold]: the average training and expected loss are the gated race's, measured "
                      f"on {rec.race['measured_on']}; this race trains the losing set for "
                      + ("at most " if rec.race.get("k") is not None else "")
                      + f"{'the whole budget' if extra >= 1 else f'about {extra:.0%} of the budget'} beside the winner's "
                      "full run" + race_tokens(rec.race.get("extra_tokens")), highlight=False)
    if rec.pool is not None:
        nxt = (f"advisor train {out}/recommendation.json --out RUN (it races D_high against D_low and keeps the "
               f"leader; --no-race trains D_{rec.strategy} alone)" if rec.race else
               f"advisor train {out}/recommendation.json --out RUN")
        console.print(f"compute: {spent}. Checker {rec.checker}. Wrote {out}/recommendation.json, train.jsonl "
                      f"({rec.train_rows} rows), "
                      + ", ".join(f"train-{n}.jsonl" for n in ("high", "low") if n != rec.schedule.strategy)
                      + " (for a race)"
                      + (", eval.jsonl" if rec.eval_rows else "") + ", report.png. "
                      + f"Next: {nxt}", highlight=False)
    else:
        console.print(f"compute: {spent}. Wrote {out}/recommendation.json (advice only) and report.png; "
                      "rerun with --pool for the selected dataset and a training manifest.", highlight=False)


def shown_best(best: dict | None) -> str | None:
    """The best checkpoint as one line of a report: the folder to load, and what it measured."""
    if not best:
        return None
    where = best["path"] or "(its checkpoint was not kept)"
    return f"{where} (step {best['step']}, epoch {best['epoch']:.2f}, accuracy {best['accuracy']:.3g})"


def trained(result) -> None:
    """What `advisor train` did (`advisor.train.Trained`): its table, then its line."""
    if result.title:
        best = {"best_checkpoint": shown_best(result.rows["best_checkpoint"])} if "best_checkpoint" in result.rows else {}
        console.print(kv_table(result.title, {**result.rows, **best}))
    if result.message:
        click.echo(result.message, err=True)
