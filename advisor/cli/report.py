"""Everything the CLI prints: rich tables on stderr for people (JSON goes to stdout via `ui.emit_json`).

Library functions return values; these render them.
"""

from __future__ import annotations

from pathlib import Path

from rich.panel import Panel
from rich.table import Table

from capacity_advisor.advisor.cli.ui import console, fmt, kv_table
from capacity_advisor.advisor.predictor import BUDGETS


def pool(p) -> None:
    s = p.summary()
    rows = {"pool": p.source, "layout": s["layout"], "problems": s["problems"], "candidates": s["candidates"],
            "per problem": s["candidates_per_problem"], "with answers": s["with_answers"]}
    if s["skipped_candidates"]:
        rows["skipped candidates"] = s["skipped_candidates"]
    if s["skipped_problems"]:
        rows["skipped problems"] = s["skipped_problems"]
        rows["e.g."] = "; ".join(f"{k}: {', '.join(v)}" for k, v in p.skipped_examples.items())
    console.print(kv_table("Pool", rows))


def scores(summary: dict, backend: str) -> None:
    m = summary["model"]
    console.print(kv_table("Scores", {
        "model": f"{m['spec']} ({m['architecture']}, {m['n_params']:,} params, {m['dtype']})",
        "backend": backend, "template": summary["template"], "candidates": summary["candidates"],
        "response tokens": summary["response_tokens"], "truncated": summary["truncated"],
        "reused from cache": summary["from_cache"], "seconds": summary["seconds"], "written": summary["scores"],
    }))


def selection(s: dict, strategy: str, score_kind: str, out: str, fmt_name: str) -> None:
    console.print(kv_table(f"Selection: {strategy}", {
        "problems": s["problems"], "rows": s["rows"], "rows from the low set": s["rows_from_low"],
        f"log-prob ({score_kind}), high set": s["mean_score_high"],
        f"log-prob ({score_kind}), low set": s["mean_score_low"],
        "likelihood gap (high - low)": s["likelihood_gap"],
        "likelihood gap per token": s["likelihood_gap_per_token"],
        "length ratio (low / high tokens)": s["length_ratio_low_high"],
        "problems where high = low": s["same_candidate"],
        "response starts, high set": _cues(s.get("start_cues_high")),
        "response starts, low set": _cues(s.get("start_cues_low")), "written": f"{out} ({fmt_name})",
    }))


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
    c = report["cost"]
    share = c["share_of_full_run"]
    line = f"probe cost: {c['probe_tokens']:,} tokens"
    if share:
        line += " = " + ", ".join(f"{100 * v:.1f}% of a {e}-epoch full run" for e, v in share.items())
    console.print(line + f". Wrote {Path(out) / 'probe.json'} and probe.png.")


def cross_validation(result: dict) -> None:
    pol = result.get("policy") or {}
    console.print(f"kind: {result['chosen']}; policy: predictor trusted up to {pol.get('max_distance')}x the typical "
                  f"distance, margin {pol.get('margin')}, range check {'on' if pol.get('use_range') else 'off'}; "
                  f"{result['rows']} rows, labels {result['labels']}, near-ties {result['ties']}", highlight=False)
    for split, methods in result["cv"].items():
        t = Table(title=f"Leave one {split} out", title_justify="left")
        for col in ("method", "regret (points)", "decision accuracy", "rows"):
            t.add_column(col, justify="left" if col == "method" else "right")
        for name, row in sorted(methods.items(), key=lambda kv: kv[1]["regret"] if kv[1]["regret"] is not None else 1e9):
            mark = " ← shipped" if name == "policy" else ""
            reg = "—" if row["regret"] is None else f"{row['regret']:.2f}"
            acc = "—" if row["decision_accuracy"] is None else f"{row['decision_accuracy']:.3f}"
            t.add_row(name + mark, reg, acc, str(row["rows"]))
        console.print(t)


def recommendation(report: dict, out: str) -> None:
    """The recommend report: the answer, its probabilities and interval, why, where the student
    sits among the calibrated ones, what the rules would say, the settings and their sources."""

    m = report["model"]
    answer = report.get("answer", report["strategy"])
    head = (f"[bold]Train on: D_{report['strategy']}[/bold]"
            + (f" (a share {report['mix']:g} of problems on their low response)" if report["strategy"].startswith("mixed")
               else f" (D_high for {report['switch_epoch']:g} epochs, then D_low)" if report.get("switch_epoch") else "")
            + (" — the evidence is silent here; mixed is the hedge" if answer == "uncertain" else "")
            + f"   confidence: {report['confidence']}   ({report['predictor']})\n"
            + f"student {m['spec']} ({m['n_params']:,} params), budget {report['budget']:g} epochs")
    co = report["crossover_epoch"]
    head += ("\npredicted crossover: D_low overtakes D_high from about epoch " + f"{co:g}") if co else \
        "\npredicted crossover: none within 10 epochs (D_high stays ahead)"
    console.print(Panel(head, title="capacity-advisor", expand=False))
    t = Table(title="Probabilities" + (" (10-90% interval over the ensemble)" if report.get("interval") else ""),
              title_justify="left")
    for s in report["probabilities"]:
        t.add_column(f"D_{s}", justify="right")
    iv = report.get("interval") or {}
    t.add_row(*[f"{p:.2f}" + (f" ({iv[s][0]:.2f}-{iv[s][1]:.2f})" if s in iv else "")
                for s, p in report["probabilities"].items()])
    console.print(t)
    for line in report.get("confidence_reasons") or []:
        console.print(f"[bold]confidence[/bold]: {line}")
    if report["reasons"]:
        console.print("[bold]Why[/bold]: " + "; ".join(report["reasons"]))
    if report.get("neighbours"):
        t = Table(title="Nearest calibrated students (what they measured at this budget)", title_justify="left")
        for col in ("student", "task", "ranking", "distance", "best", "high", "low", "mixed"):
            t.add_column(col)
        b = f"{min(BUDGETS, key=lambda x: abs(x - report['budget'])):g}"
        for n in report["neighbours"]:
            o = n.get("outcomes", {}).get(b, {})
            t.add_row(n["student"], str(n["task"]), str(n["score"]), f"{n['distance']:.2f}", o.get("label", "—"),
                      *[fmt(o.get(s)) for s in ("high", "low", "mixed")])
        console.print(t)
    outside = [r for r in (report.get("range") or []) if r["inside"] is False]
    if outside:
        console.print("[bold]outside the calibrated range[/bold]: " + ", ".join(
            f"{r['feature']} = {r['value']:.3g} ({r['min']:.3g} to {r['max']:.3g})" for r in outside))
    if report.get("paper_prior"):
        pp = report["paper_prior"]
        console.print(f"[bold]the paper, for students of this size[/bold]: {pp['answer']} — {pp['confidence_reasons'][0]}")
    t = Table(title="What the rules would say", title_justify="left", show_header=False)
    for rule, choice in report["baselines"].items():
        t.add_row(rule, choice)
    console.print(t)
    t = Table(title="Settings chosen (and where from)", title_justify="left", show_header=False)
    for k, s in report["settings"].items():
        t.add_row(k, fmt(s["value"]), s["source"])
    console.print(t)
    cost = report.get("probe_cost")
    spent = f"{report['seconds']}s"
    if cost and cost.get("share_of_full_run"):
        spent += f"; probe {cost['probe_tokens']:,} tokens"
    if report["train_rows"]:
        console.print(f"compute: {spent}. Wrote {out}/recommendation.json, train.jsonl ({report['train_rows']} rows)"
                      + (", eval.jsonl" if report["eval_rows"] else "") + ", report.png. "
                      + f"Next: advisor train {out}/recommendation.json --out RUN")
    else:
        console.print(f"compute: {spent}. Wrote {out}/recommendation.json (advice only) and report.png; "
                      "rerun with --pool for the selected dataset and a training manifest.")
