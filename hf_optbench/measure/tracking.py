"""The run config that W&B, TensorBoard and trackio show: the optimizer that ran, its implementation, every
hyperparameter with its source, and the schedule that ran.

Why: those trackers build their config from ``TrainingArguments`` (``args.to_dict()``), whose ``optim`` and
``lr_scheduler_type`` say nothing of an optimizer handed to the Trainer (a Lion run with the GPT-3 cosine showed
``optim: adamw_torch_fused, lr_scheduler_type: linear``; ``adam_beta2`` 0.999 and ``weight_decay`` 0.0 beside an
optimizer that ran 0.99 and 0.1). The recorder (:mod:`hf_optbench.measure.recorder`) sets those fields to what runs
before the integrations read them and attaches :class:`TrackerConfigCallback` after them, which pushes an
``hf_optbench`` section (the record of what ran: a run's plan record, or in a Trainer of the Python API what the
optimizer and scheduler hold, :func:`hf_optbench.optim.held.held_record`) to every active ``report_to``
integration at train begin, through the run objects transformers' integration callbacks set up:

* W&B: ``wandb.run.config["hf_optbench"]`` (a nested dict: ``hf_optbench.optimizer``, ``hf_optbench.schedule.name``...);
* TensorBoard: a text ``hf_optbench`` (the JSON) and the HParams plugin's session (:func:`flat_hparams`: every
  scalar of the section, sources left out) with ``train/loss``, ``eval/loss`` and ``eval/accuracy`` as its metrics;
* trackio: ``trackio.config`` with the flat keys ``hf_optbench/...``.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback
from transformers.integrations import integration_utils as iu

if TYPE_CHECKING:
    from transformers import Trainer

SECTION = "hf_optbench"
# Scalars the TensorBoard callback logs (transformers' rewrite_logs names), shown beside the hparams.
HPARAM_METRICS = ("train/loss", "eval/loss", "eval/accuracy")


def _plain(value: Any) -> Any:
    """JSON-able: tuples to lists, other objects to their repr (a tracker config holds plain values only)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return repr(value)


def tracker_config(record: Mapping[str, Any], *, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``hf_optbench`` section: the record of what ran (a run's plan record or
    :func:`hf_optbench.optim.held.held_record`:
    ``optimizer``, ``optimizer_impl``, ``hyperparameters`` {key: {"value", "source"}} as the optimizer holds them,
    ``param_groups``, ``schedule``), plus ``extra`` (size, seed, tokens per step...), as plain values."""
    return _plain({**dict(record), **dict(extra or {})})


def flat_hparams(config: Mapping[str, Any], prefix: str = SECTION) -> dict[str, Any]:
    """``config`` flattened to ``prefix/a/b`` keys with scalar values (lists as JSON text), for TensorBoard's
    HParams and trackio; the long ``source`` citations are left out (they are in the full config)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}/{key}"
        if key == "source":
            continue
        if isinstance(value, Mapping):
            flat.update(flat_hparams(value, name))
        elif isinstance(value, list):
            flat[name] = json.dumps(value)
        elif value is not None:
            flat[name] = value
    return flat


def _push_wandb(config: dict[str, Any]) -> bool:
    import wandb

    if wandb.run is None:
        return False
    wandb.run.config.update({SECTION: config}, allow_val_change=True)
    return True


def _push_tensorboard(writer: Any, config: dict[str, Any]) -> bool:
    from torch.utils.tensorboard.summary import hparams

    writer.add_text(SECTION, "```json\n" + json.dumps(config, indent=1) + "\n```")
    file_writer = getattr(writer, "file_writer", None) or writer._get_file_writer()
    for summary in hparams(flat_hparams(config), dict.fromkeys(HPARAM_METRICS, 0.0)):
        file_writer.add_summary(summary)  # the session of this log dir (add_hparams would open a sub-run)
    writer.flush()
    return True


def _push_trackio(module: Any, config: dict[str, Any]) -> bool:
    module.config.update(flat_hparams(config), allow_val_change=True)
    return True


class TrackerConfigCallback(TrainerCallback):
    """Pushes ``config`` (:func:`tracker_config`) to the active integrations at train begin. Use
    :func:`attach_tracker_config`, which places it after them (they set up their runs in their own
    ``on_train_begin``)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.pushed: list[str] = []  # the integrations that received it
        self._handler: weakref.ref | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        handler = self._handler() if self._handler is not None else None
        if not state.is_world_process_zero or handler is None:
            return
        self.pushed = [name for name, done in _push_all(handler.callbacks, self.config) if done]


def _push_all(callbacks: list[Any], config: dict[str, Any]) -> list[tuple[str, bool]]:
    done = []
    for cb in callbacks:
        if isinstance(cb, iu.WandbCallback) and getattr(cb, "_initialized", False):
            done.append(("wandb", _push_wandb(config)))
        elif isinstance(cb, iu.TensorBoardCallback) and getattr(cb, "tb_writer", None) is not None:
            done.append(("tensorboard", _push_tensorboard(cb.tb_writer, config)))
        elif isinstance(cb, iu.TrackioCallback) and getattr(cb, "_initialized", False):
            done.append(("trackio", _push_trackio(cb._trackio, config)))
    return done


def attach_tracker_config(trainer: Trainer, config: dict[str, Any]) -> Any:
    """Add a :func:`TrackerConfigCallback` for ``config`` at the end of ``trainer``'s callbacks (after the
    ``report_to`` integrations, which set up their runs in their own ``on_train_begin``); returns it."""
    callback = TrackerConfigCallback(config)
    callback._handler = weakref.ref(trainer.callback_handler)
    trainer.callback_handler.callbacks.append(callback)
    return callback
