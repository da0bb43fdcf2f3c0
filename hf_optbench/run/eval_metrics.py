"""Eval accuracy beside eval loss, the way transformers' ``run_clm.py`` computes it: ``compute_metrics`` with
``preprocess_logits_for_metrics``, through an ``evaluate`` metric.

* :func:`preprocess_logits_for_metrics` reduces each eval batch's logits to argmax ids on the device, so the
  Trainer never keeps full-vocabulary logits (batch x block x vocab floats) for the whole eval split.
* :class:`NextTokenAccuracy` (the ``compute_metrics`` callable) shifts ids and labels by one position (a causal LM
  predicts the next token), drops ignored labels (-100) and computes the share of right predictions with the
  ``evaluate`` metric shipped in ``resources/metrics/next_token_accuracy`` (loads offline). ``evaluate`` is imported
  on the first evaluation only: its import takes 8-10 s (it pulls in transformers.pipelines).

The Trainer names the result ``eval_accuracy``: it reaches metrics.jsonl eval rows, summary.json
(``final_eval_accuracy``) and the trackers (``eval/accuracy``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

METRIC_DIR = Path(__file__).resolve().parents[1] / "resources" / "metrics" / "next_token_accuracy"
IGNORE_INDEX = -100  # transformers' label for positions without a loss


def preprocess_logits_for_metrics(logits: Any, labels: Any) -> Any:
    """Argmax token ids of one eval batch (``logits`` may be the model output's tuple; its first item)."""
    if isinstance(logits, tuple):
        logits = logits[0]
    return logits.argmax(dim=-1)


def load_accuracy_metric() -> Any:
    """The shipped ``evaluate`` metric (in memory: no cache files, safe with several ranks computing it)."""
    import evaluate

    return evaluate.load(str(METRIC_DIR), keep_in_memory=True)


class NextTokenAccuracy:
    """``compute_metrics`` for a causal LM: ``{"accuracy": share of next tokens predicted right}``."""

    def __init__(self) -> None:
        self._metric: Any = None

    def __call__(self, eval_pred: Any) -> dict[str, float | None]:
        import numpy as np

        preds, labels = eval_pred.predictions, eval_pred.label_ids
        if isinstance(preds, tuple):
            preds = preds[0]
        preds = np.asarray(preds)[:, :-1].reshape(-1)
        labels = np.asarray(labels)[:, 1:].reshape(-1)
        keep = labels != IGNORE_INDEX
        if self._metric is None:
            self._metric = load_accuracy_metric()
        return self._metric.compute(predictions=preds[keep], references=labels[keep])


def eval_metric_kwargs() -> dict[str, Any]:
    """The Trainer keyword arguments that add eval accuracy: ``Trainer(..., **eval_metric_kwargs())``."""
    return {"compute_metrics": NextTokenAccuracy(), "preprocess_logits_for_metrics": preprocess_logits_for_metrics}
