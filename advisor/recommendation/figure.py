"""OUT/report.png of `advisor recommend`, drawn from a Recommendation.

Left: P(each option is best) by epoch budget. With a probe, middle: the probe's curves; right:
where the student sits among the calibrated students (parameters against the input that moved
the advice most), coloured by the set that was best for them at this budget. Every text is at
least 10 pt and every panel has a legend.
"""

from __future__ import annotations

import math
from pathlib import Path

from capacity_advisor.advisor.predictor.labels import NOT_MEASURED  # inputs that are settings of the run
from capacity_advisor.advisor.recommendation.result import BUDGET_GRID, Recommendation
from capacity_advisor.probes.run import ProbeReport
from capacity_advisor.core.files import atomic_path

DPI = 100
FONT = 10  # points: the smallest text on the figure
COLORS = {"high": "tab:blue", "low": "tab:red", "mixed": "tab:purple"}


def build_figure(rec: Recommendation, predictor):
    """The figure (a matplotlib Figure; the caller saves or closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 3 if rec.probe else 1
    with plt.rc_context({"font.size": FONT, "axes.titlesize": FONT + 1, "axes.labelsize": FONT, "xtick.labelsize": FONT,
                         "ytick.labelsize": FONT, "legend.fontsize": FONT}):
        fig, axes = plt.subplots(1, panels, figsize=(5.6 * panels, 4.2), squeeze=False)
        _budgets(axes[0][0], rec)
        if rec.probe:
            _probe(axes[0][1], rec.probe)
            _neighbourhood(axes[0][2], rec, predictor)
        fig.tight_layout()
    return fig


def write_figure(rec: Recommendation, predictor, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = build_figure(rec, predictor)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=DPI, format="png")
    plt.close(fig)


def _budgets(ax, rec: Recommendation) -> None:
    for option, probs in rec.curve.items():
        ax.plot(BUDGET_GRID, probs, label=f"P(D_{option})", color=COLORS.get(option))
    ax.axvline(rec.budget, color="gray", ls="--", lw=1, label=f"budget ({rec.budget:g} epochs)")
    if rec.crossover_epoch:
        ax.axvline(rec.crossover_epoch, color="tab:red", ls=":", lw=1, label="D_low overtakes D_high")
    ax.set_xlabel("epoch budget")
    ax.set_ylabel("P(best set)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"D_{rec.strategy} at {rec.budget:g} epochs ({rec.confidence} confidence)")
    ax.legend()


def _probe(ax, probe: ProbeReport) -> None:
    for s, c in probe.curves.items():
        key = "answer_logprob" if c[-1].get("answer_logprob") is not None else "teacher_nll"
        ax.plot([p["step"] for p in c], [p[key] for p in c], marker="o", ms=4, label=f"D_{s}", color=COLORS.get(s))
        ax.set_ylabel(key)
    ax.set_xlabel("probe step")
    ax.set_title("probe")
    ax.legend()


def _neighbourhood(ax, rec: Recommendation, predictor) -> None:
    measured = [k for k in predictor.features if k not in NOT_MEASURED]
    feature = next((r.split(" = ")[0] for r in rec.reasons if r.split(" = ")[0] in measured), None) \
        or ("gap_answer_logprob_area_gain" if "gap_answer_logprob_area_gain" in measured else None)
    budget = rec.calibrated_budget
    shown = set()
    for u in predictor.units if feature and feature in predictor.range else []:
        if u.get("n_params") is None:
            continue
        y = u["z"][measured.index(feature)] * predictor.range[feature]["sd"] + predictor.range[feature]["mean"]
        label = (u.get("outcomes", {}).get(budget) or {}).get("label", "high")
        ax.scatter(u["n_params"], y, s=14, color=COLORS.get(label), alpha=0.6,
                   label=None if label in shown else f"best: D_{label}")
        shown.add(label)
    y_student = rec.inputs.get(feature) if feature else None
    if isinstance(y_student, (int, float)) and math.isfinite(y_student):
        ax.scatter(rec.model["n_params"], y_student, s=90, marker="*", color="black", label="this student")
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel(feature or "(no measured input)")
    ax.set_title(f"calibrated students at {budget} epochs")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no calibrated students to show", ha="center", va="center", transform=ax.transAxes)
