"""Convergence probe: eval perplexity, steps/tokens/seconds to each target loss, area under the loss curve.

* Perplexity is ``exp(eval_loss)``: the Trainer's eval loss is already the mean token NLL over the validation
  split (``evaluate``'s perplexity metric would load a Hub model and run it again).
* Targets: the first step at which the train loss (trailing mean over ``target_smoothing_steps``) or the raw
  eval loss reaches each target (``metrics.TargetTracker``, the rule the report uses too).
* ``loss_auc_tokens``: trapezoid area under train loss vs tokens (``metrics.trapezoid_auc``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hf_optbench.config.bench_args import BenchArguments
from hf_optbench.measure.metrics import TargetTracker, trapezoid_auc
from hf_optbench.measure.probe_base import Probe, Record, RunContext, finite

if TYPE_CHECKING:
    import torch
    from transformers import TrainerControl, TrainingArguments


def perplexity(loss: Any) -> float | None:
    """exp(loss) when finite, else None."""
    loss = finite(loss)
    if loss is None:
        return None
    try:
        return finite(math.exp(loss))
    except OverflowError:
        return None


class ConvergenceProbe(Probe):
    """Adds ``eval_perplexity`` (and ``eval_accuracy`` when the Trainer computed it) to eval rows; summary:
    ``targets``, ``loss_auc_tokens``, ``final_eval_accuracy`` (the last eval row's, None without one),
    ``final_train_loss`` (the last train row's: the last step's loss, also where the Trainer logs a mean over the
    steps since its previous log)."""

    def __init__(self, bench: BenchArguments) -> None:
        self.bench = bench
        self._reset()

    def _reset(self) -> None:
        self._train_targets = TargetTracker(self.bench.target_losses, self.bench.target_smoothing_steps)
        self._eval_targets = TargetTracker(self.bench.eval_targets, 1)
        self._auc_x: list[float] = []
        self._auc_y: list[float] = []
        self._eval_accuracy: float | None = None
        self._final_train_loss: float | None = None

    def on_train_begin(self, ctx: RunContext, args: TrainingArguments, model: torch.nn.Module) -> None:
        self._reset()

    def replay(self, rows: Sequence[dict[str, Any]]) -> None:
        for row in rows:
            if row.get("kind") == "train":
                self._observe_train(row)
            elif row.get("kind") == "eval":
                self._observe_eval(row)

    def _observe_train(self, row: Mapping[str, Any]) -> None:
        loss, tokens = finite(row.get("loss")), row.get("tokens")
        self._final_train_loss = loss
        self._train_targets.update(loss, row["step"], tokens, row.get("elapsed_s"))
        if loss is not None and tokens is not None:
            self._auc_x.append(float(tokens))
            self._auc_y.append(loss)

    def _observe_eval(self, row: Mapping[str, Any]) -> None:
        if "eval_accuracy" in row:
            self._eval_accuracy = row["eval_accuracy"]
        self._eval_targets.update(finite(row.get("eval_loss")), row["step"], row.get("tokens"), row.get("elapsed_s"))

    def on_train_row(self, ctx: RunContext, rec: Record, control: TrainerControl) -> None:
        self._observe_train(rec.row)

    def on_eval_row(self, ctx: RunContext, rec: Record) -> None:
        rec.row["eval_perplexity"] = perplexity(rec.source.get("eval_loss"))
        if "eval_accuracy" in rec.source:  # the Trainer's compute_metrics (hf_optbench.run.eval_metrics)
            rec.row["eval_accuracy"] = finite(rec.source["eval_accuracy"])
        self._observe_eval(rec.row)

    def on_log(self, ctx: RunContext, logs: Mapping[str, Any]) -> dict[str, Any]:
        # an "eval_" key: the recorder forwards it as eval_optbench/..., which trackers show under eval/
        ppl = perplexity(logs["eval_loss"]) if "eval_loss" in logs and "loss" not in logs else None
        return {} if ppl is None else {"eval_perplexity": ppl}

    def summary(self, ctx: RunContext) -> dict[str, Any]:
        return {
            "targets": {"train": self._train_targets.as_dict(), "eval": self._eval_targets.as_dict()},
            "target_smoothing_steps": self.bench.target_smoothing_steps,
            "loss_auc_tokens": trapezoid_auc(self._auc_x, self._auc_y),
            "final_eval_accuracy": self._eval_accuracy,
            "final_train_loss": self._final_train_loss,
        }
