"""The report's convergence-target and tuning tables, aggregated with pandas: the targets and how they were
derived, every run's tokens to each target (censored at the budget), the eval loss at matched token budgets, and
the tuning curve per optimizer and size. Each function returns (header, rows) for ``Doc.table``."""

from __future__ import annotations

from typing import Any

from hf_optbench.report.analysis import Analysis


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


def _fmt(mean: float, sd: float, n: int, fmt: str) -> str:
    if mean != mean:  # NaN: no value
        return "–"
    sd_text = fmt.format(sd) if "," in fmt else f"{sd:.2g}"
    return fmt.format(mean) + (f" ± {sd_text}" if n > 1 and sd == sd and sd > 0 else "")


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
                text = _fmt(a["mean"], a["sd"], int(a["n"]), "{:,.0f}" if column == "tokens" else "{:.4f}")
                if column == "tokens" and a["censored"]:
                    text += f" ({int(a['censored'])}/{int(a['n'])} censored)"
                cells.append(text)
            rows.append([size, opt, *cells])
    return header, rows


def tuning_table(an: Analysis) -> tuple[list[str], list[list[str]], str]:
    """(header, rows, loss key) of the tuning curve: one row per optimizer, size and multiplier."""
    from hf_optbench.report.tuning_curves import curve_frame

    frame, key = curve_frame(an.tuning)
    header = ["optimizer", "size", "lr multiplier", "learning rate", key.replace("_", " "), "completed seeds",
              "diverged/failed", "best"]
    if frame.empty:
        return header, [], key
    rows = [[r.optimizer, r.model_size, f"{r.lr_multiplier:g}", f"{r.learning_rate:.3g}",
             _fmt(r.loss, r.loss_sd, int(r.seeds), "{:.4f}"), str(int(r.seeds)), str(int(r.bad)),
             "best" if r.best else ""] for r in frame.itertuples()]
    return header, rows, key
