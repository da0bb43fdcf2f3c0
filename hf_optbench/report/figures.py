"""Every figure of the report, written in one pass: each is drawn by the module of its section
(:mod:`hf_optbench.report.sections`) and named here by the file the report embeds (``loss_<cell>.png``,
``memory.png``, ``scaling.png``, ...). The rate-transfer plot is written by :func:`hf_optbench.report.build.build_report`
beside these, from the rows its section computes."""

from __future__ import annotations

from pathlib import Path

from hf_optbench.report.analysis import Analysis
from hf_optbench.report.sections.convergence import plot_loss, plot_lr_gradnorm
from hf_optbench.report.sections.hyperparameters import plot_tuning
from hf_optbench.report.sections.memory import plot_memory
from hf_optbench.report.sections.ratios import plot_scaling, scaling_name
from hf_optbench.report.sections.throughput_stability import plot_by_params
from hf_optbench.report.sections.verdict import plot_data_axis
from hf_optbench.study.records import cells_of


def write_plots(an: Analysis, out: Path) -> dict[str, Path]:
    """Every plot the analysis supports, written into ``out``: {file name: path}. {} without a finished run. Per cell
    (a size, or a size at a data ratio: ``Analysis.file_key`` names its files)."""
    files: dict[str, Path] = {}
    if an.ok():
        for size in an.sizes:
            if any(r.cell.label == size for r in an.ok()):
                name = an.file_key(size)
                files[f"loss_{name}.png"] = plot_loss(an, size, out / f"loss_{name}.png")
                files[f"lr_gradnorm_{name}.png"] = plot_lr_gradnorm(an, size, out / f"lr_gradnorm_{name}.png")
        files["memory.png"] = plot_memory(an, out / "memory.png")
        mean_mark = "line = mean over seeds)" if len(an.model_sizes) > 1 else "bar = mean over seeds)"
        files["throughput.png"] = plot_by_params(
            an, (("step_time_median_s", "median step time (s)"), ("tokens_per_s", "tokens / s")),
            f"step time and throughput (wall clock: dots = seeds, {mean_mark}", out / "throughput.png", log_y=True)
        files["stability.png"] = plot_by_params(
            an, (("loss_spikes_per_1k", "loss spikes per 1k steps"), ("diverged", "diverged (1) or not (0)")),
            f"stability (dots = seeds, {mean_mark[:-1]}; optimizers offset sideways)", out / "stability.png",
            dodge=True)
    for at in dict.fromkeys(v.at for v in an.verdicts_along("size")):  # one per ratio every size ran
        if an.multi and len(an.model_sizes) < 2:
            break  # one size: nothing to draw along size (the data axis has its own plot)
        if (scaling := plot_scaling(an, out / scaling_name(an, at), at)) is not None:
            files[scaling_name(an, at)] = scaling
    if an.multi and (data := plot_data_axis(an, out / "data_axis.png")) is not None:
        files["data_axis.png"] = data
    for size in cells_of(r for r in an.tuning if r.model_size):
        path = plot_tuning(an, size, out / f"tuning_{an.file_key(size)}.png")
        if path is not None:
            files[f"tuning_{an.file_key(size)}.png"] = path
    return files
