"""The convergence section: the targets and how they were derived, each optimizer's losses and steps, tokens and
seconds to the verdict's target (:data:`CONVERGENCE`), every run's tokens to each target (censored at the budget) and
its eval loss at matched token budgets, aggregated with pandas; and the loss and learning-rate plots per cell. The
targets themselves are computed by :mod:`hf_optbench.report.targets` (the analysis reads them for every section).
Each table function returns (header, rows) for ``Doc.table``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hf_optbench.report.analysis import Analysis, window
from hf_optbench.report.plots import colors, eng_axis, finished_runs, plt_, save
from hf_optbench.report.tables import (
    OPTIMIZER,
    SIZE,
    Column,
    Group,
    GroupTable,
    fmt_mean_sd,
    pm,
    render,
    wall_note,
)
from hf_optbench.rundir import BASELINE


def convergence_section(doc: Any, an: Analysis, files: dict[str, Path]) -> None:
    """The evidence's convergence section (``doc``: report.build.Doc): the targets, the convergence table, tokens
    to each target, the eval loss at matched budgets, and each cell's loss and learning-rate plots."""
    from hf_optbench.report.targets import VERDICT_TARGET

    doc.h(2, "Convergence")
    if an.given_targets:
        doc.p("Target loss per size: given with --target-loss (the verdict uses it).")
    else:
        doc.p(f"Targets, fixed before any other optimizer is looked at: {BASELINE}'s smoothed train loss at 25 / 50 / "
              f"75 / 100 % of its step budget, averaged over its seeds, so adding or dropping an optimizer cannot move "
              f"them. The verdict uses the {VERDICT_TARGET} target: mid-run, where the optimizer and not the end of the "
              "schedule decides when it is reached. Train loss, not eval loss: it is logged every step, so a time to "
              "target is resolved to one step (eval runs every eval_steps); the held-out comparison is the eval loss at "
              "matched token budgets below.")
    doc.table(*targets_table(an))
    for note in an.target_notes:
        doc.p(f"Note: {note}.")
    doc.table(*render(CONVERGENCE.columns, CONVERGENCE.rows(an)))
    doc.p("Mean train loss over budget: the area under train loss vs tokens divided by the token budget (summary.json's "
          "loss_auc_tokens is not normalised, so a run that stopped early would look better); a run that logged fewer "
          "tokens than its budget is extended at its last loss, a diverged run has none (it counts under Stability). "
          "A diverged run's final eval loss is left out for the same reason.")
    doc.h(3, "Tokens to each target")
    doc.p("Mean ± sd over seeds; a run that never reached a target (or diverged first) counts at its token budget and "
          "is counted as censored: the mean is then a lower bound.")
    doc.table(*per_target_table(an, "tokens"))
    doc.h(3, "Eval loss at matched token budgets")
    doc.p("Every run's eval loss at the token counts of the target points (linear interpolation between the two "
          "evaluations around each point; – where the run has no evaluation on both sides, e.g. before the first one "
          "or after a divergence).")
    doc.table(*per_target_table(an, "eval"))
    for size in an.sizes:
        for key in (f"loss_{an.file_key(size)}.png", f"lr_gradnorm_{an.file_key(size)}.png"):
            if key in files:
                doc.img(files[key], key)


def _reached(g: Group) -> str:
    """"2/3 (1 censored)": runs that reached the verdict's target, of the finished ones; the others count at
    their budget."""
    runs = [r for r in g.runs() if r.get("tokens_to_target") is not None]
    censored = sum(1 for r in runs if r.get("tokens_to_target_censored"))
    return f"{len(runs) - censored}/{len(runs)}" + (f" ({censored} censored)" if censored else "")


COMPLETED = ("completed",)
CONVERGENCE = GroupTable(keep=lambda g: bool(g.runs()), columns=[
    SIZE, OPTIMIZER,
    Column("final eval loss", pm("final_eval_loss", statuses=COMPLETED)),
    Column("eval loss at 50 % budget", pm("eval_loss_at_50%")),
    Column("mean train loss over budget", pm("mean_loss_over_budget", statuses=COMPLETED)),
    Column("steps to target", pm("steps_to_target", "{:.0f}")),
    Column("tokens to target", pm("tokens_to_target", "{:,.0f}")),
    Column("seconds to target", lambda g: pm("seconds_to_target", "{:.1f}")(g) + wall_note(g, "seconds_to_target")),
    Column("reached", _reached),
])


def targets_table(an: Analysis) -> tuple[list[str], list[list[str]]]:
    """One row per size and target: its loss, where on the budget it sits, how it was derived."""
    from hf_optbench.report.targets import VERDICT_TARGET

    rows = []
    for size in an.sizes:
        for t in an.targets.get(size, []):
            used = t.name == VERDICT_TARGET or t.name == "given"
            rows.append([size, t.name + (" (verdict)" if used else ""), f"{t.loss:.4f}",
                         "–" if t.step is None else str(t.step), "–" if t.tokens is None else f"{t.tokens:,}",
                         t.derivation])
    return ["size", "target", "loss", "step", "tokens", "derived from"], rows


def _long(an: Analysis) -> Any:
    """One row per finished comparison run and target: tokens to it, censored, and the eval loss at its tokens."""
    import pandas as pd

    rows = [{"model_size": r.cell.label, "optimizer": r.optimizer, "seed": r.seed, "target": name,
             "tokens": hit["tokens"], "censored": bool(hit["censored"]), "eval": r.get("eval_at", {}).get(name)}
            for r in an.ok() for name, hit in (r.get("to_target") or {}).items()]
    frame = pd.DataFrame(rows, columns=["model_size", "optimizer", "seed", "target", "tokens", "censored", "eval"])
    return frame.astype({"tokens": "float64", "eval": "float64"})


def per_target_table(an: Analysis, column: str) -> tuple[list[str], list[list[str]]]:
    """Per size and optimizer, one cell per target: mean ± sd over seeds of ``column`` ("tokens": tokens to the
    target, with the censored count; "eval": eval loss at the target's token count)."""
    frame = _long(an)
    names = list(dict.fromkeys(t.name for size in an.sizes for t in an.targets.get(size, [])))
    header = ["size", "optimizer"] + [f"{n} target" if column == "tokens" else f"at {n} of budget" for n in names]
    if frame.empty:
        return header, []
    agg = frame.groupby(["model_size", "optimizer", "target"]).agg(
        mean=(column, "mean"), sd=(column, "std"), n=(column, "count"), censored=("censored", "sum"))
    rows = []
    for size in an.sizes:
        for opt in an.optimizers:
            if (size, opt) not in agg.index.droplevel("target"):
                continue
            cells = []
            for name in names:
                if (size, opt, name) not in agg.index:
                    cells.append("–")
                    continue
                a = agg.loc[(size, opt, name)]
                text = fmt_mean_sd(a["mean"], a["sd"], int(a["n"]), "{:,.0f}" if column == "tokens" else "{:.4f}")
                if column == "tokens" and a["censored"]:
                    text += f" ({int(a['censored'])}/{int(a['n'])} censored)"
                cells.append(text)
            rows.append([size, opt, *cells])
    return header, rows


# ------------------------------------------------------------------------------------------------ figures
def _xy(rows: Sequence[Mapping[str, Any]], x_key: str, y_key: str) -> tuple[list[float], list[float]]:
    pts = [(float(r[x_key]), float(r[y_key])) for r in rows if r.get(x_key) is not None and r.get(y_key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def _smoothed(xs: Sequence[float], ys: Sequence[float], n: int) -> tuple[list[float], list[float]]:
    """Trailing mean of ``n`` (the recorder's target rule), cut at the first NaN/Inf (a divergence)."""
    import pandas as pd

    end = next((i for i, y in enumerate(ys) if not math.isfinite(y)), len(ys))
    return list(xs[:end]), pd.Series(ys[:end], dtype="float64").rolling(n, min_periods=1).mean().tolist()


def _label_targets(ax, targets: list) -> None:
    """Name each target line at the right edge, above it; a label whose line sits closer than 4 % of the axis to the
    next line up goes below its line instead (the 75 % and 100 % targets of a run past the transient are often a few
    hundredths of a nat apart, and two labels above their lines printed over each other)."""
    lo, hi = ax.get_ylim()
    gap = 0.04 * (hi - lo)
    losses = sorted(t.loss for t in targets)
    for t in targets:
        above = [x for x in losses if x > t.loss]
        crowded = bool(above) and min(above) - t.loss < gap
        ax.annotate(t.name, (1.0, t.loss), xycoords=("axes fraction", "data"), fontsize=7, color="grey",
                    ha="right", va="top" if crowded else "bottom")


def plot_loss(an: Analysis, size: str, path: Path) -> Path:
    """Train loss (trailing mean, one thin line per seed) and eval loss (markers per seed) of one size against
    steps, tokens and train seconds, with the size's targets: an optimizer can win per step and lose per second."""
    plt = plt_()
    col = colors(an.optimizers)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), sharey=True)
    tops, lows = [], []
    for ax, (x_key, label) in zip(axes, (("step", "optimizer steps"), ("tokens", "tokens"),
                                         ("elapsed_s", "train seconds (wall clock)")), strict=True):
        for opt in an.optimizers:
            for i, r in enumerate(finished_runs(an, opt, size)):
                m = an.metrics.get(r.run_id, {})
                xs, ys = _smoothed(*_xy(m.get("train", []), x_key, "loss"), window(r))
                ax.plot(xs, ys, color=col[opt], lw=0.8, alpha=0.8, label=opt if i == 0 else None)
                if ys:
                    tops.append(ys[len(ys) // 10])
                    lows.append(min(ys))
                if r.status == "diverged" and ys:
                    ax.plot(xs[-1], ys[-1], "x", color=col[opt], ms=9, mew=2, label=f"{opt} diverged")
                ex, ey = _xy(m.get("eval", []), x_key, "eval_loss")
                ax.plot(ex, ey, "o", color=col[opt], ms=3.5, mfc="none", mew=0.8)
        for t in an.targets.get(size, []):
            ax.axhline(t.loss, color="grey", ls=":", lw=0.9)
        ax.set_xlabel(label)
        if x_key == "tokens":
            eng_axis(ax.xaxis)
        ax.grid(alpha=0.3)
    if tops and lows:
        span = max(tops) - min(lows)
        axes[0].set_ylim(min(lows) - 0.05 * span, max(tops) + 0.05 * span)
    for ax in axes:
        _label_targets(ax, an.targets.get(size, []))
    axes[0].set_ylabel("loss")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{size}: train loss (trailing mean, one line per seed), eval loss (circles), targets (dotted); "
                 "y axis starts after the first 10 % of steps")
    return save(fig, path)


def plot_lr_gradnorm(an: Analysis, size: str, path: Path) -> Path:
    """Learning rate and pre-clip gradient norm of one size against steps, one thin line per seed."""
    plt = plt_()
    col = colors(an.optimizers)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, key in zip(axes, ("lr", "grad_norm"), strict=True):
        for opt in an.optimizers:
            for i, r in enumerate(finished_runs(an, opt, size)):
                xs, ys = _xy(an.metrics.get(r.run_id, {}).get("train", []), "step", key)
                ax.plot(xs, ys, color=col[opt], lw=0.7, alpha=0.8, label=opt if i == 0 else None)
        ax.set_xlabel("optimizer steps")
        ax.set_ylabel("learning rate" if key == "lr" else "gradient norm (pre-clip)")
        if key == "grad_norm":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{size}: learning rate and gradient norm (one line per seed)")
    return save(fig, path)
