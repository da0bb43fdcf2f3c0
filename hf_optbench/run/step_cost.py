"""What a training step of a run pays for beyond the model and the optimizer, and what it need not.

* :func:`drop_training_logits`: in training, with labels given, the model's output leaves out its logits. Only
  the loss is used there (``Trainer.compute_loss`` keeps ``outputs["loss"]``), while under bf16/fp16 accelerate
  wraps the forward in ``ConvertOutputsToFp32``, which copies every output tensor to fp32: at 64 x 1,024 x
  50,304 logits that is 6.6 GB read and 13.2 GB written per micro-batch, ~6.6 ms at an H100's copy rate, for
  nothing. Evaluation (the model in eval mode) and any call without labels (Sophia-G's Hessian estimate samples
  from the logits) get the whole output as before, and the loss is computed from the same logits either way. Only
  under bf16/fp16: in fp32 nothing is converted, and the wrapper's own call and the output it rebuilds cost ~60 us
  per micro-batch (measured at the CPU demo's shape, interleaved, CPU time).
* :func:`flops_once`: the Trainer's ``floating_point_ops`` (its ``total_flos``, saved in trainer_state.json) is
  ``6 x tokens x model.num_parameters(exclude_embeddings=True)``, and ``num_parameters`` walks every module on every
  micro-batch (0.4-2 ms of host time at the CPU demo's shape); the count is taken once per run instead,
  the same figure.

* :func:`start_up_heap_frozen`: while training, Python's garbage collector leaves the objects made before it
  alone (``gc.freeze``). A run's process holds ~450,000 tracked objects by then (torch, transformers, datasets, the
  model, the Trainer); a full collection walks them all, and the allocations of training trigger one or two per
  run: measured at the CPU demo's shape (300 steps, a shared 2-core machine), 0.8 s of gen-2 collection and 0.08 s
  of younger ones, against 0.001 s frozen, about 3 ms per step of a ~7 ms step. In a run forked from the sweep's
  warm worker a full collection also writes to every inherited object, copying the worker's pages.
* :func:`package_lookup_once`: accelerate's ``AcceleratedOptimizer.step`` asks whether the ``lomo_optim`` package
  is installed twice per optimizer step (accelerate 1.15, accelerate/optimizer.py), and accelerate does not keep
  the answer (accelerate/utils/imports.py ``is_lomo_available``; transformers keeps its own copy of the same check
  in an ``lru_cache``): each ask is an ``importlib.util.find_spec`` over ``sys.meta_path`` and every ``sys.path``
  entry. Measured on a 2-core AMD EPYC, one thread, idle: 29.5 us per ask, the wrapped step of a one-parameter SGD
  87.0 us against 15.4 us unwrapped, 17.5 us with the answer kept. A package does not appear mid-run, so the
  answer is kept for the process: the name accelerate/optimizer.py calls is bound to a cached copy of the same
  function (the same answer, importlib asked on the first call).

Where the Trainer itself waits for the GPU (transformers 5.24's trainer.py): at each loss log,
``tr_loss.item()`` and ``grad_norm.item()`` (``_maybe_log_save_evaluate``; hence ``logging_steps`` 10 in the GPU
recipes, the recorder reading every step's values then: :mod:`hf_optbench.measure.step_values`); under DeepSpeed,
``grad_norm.item()`` every step (``_get_grad_norm``); with ``logging_nan_inf_filter`` on, a NaN test of every
micro-batch's loss used as a bool (off in hf_optbench); with ``include_num_input_tokens_seen``, a gathered count's
``.item()`` per micro-batch (off); and each batch's copy to the GPU, which waits for the stream unless accelerate's
``non_blocking`` is on with pinned memory (on in a run, ``run.train._build_trainer``).

The first two are set on the objects (an instance's ``forward``, the Trainer's ``floating_point_ops``, which its
docstring says to override), and :func:`package_lookup_once` rebinds one name in ``accelerate.optimizer``, so
hf_optbench still has no Trainer or model subclass.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Iterator
from types import MethodType
from typing import Any


def drop_training_logits(model: Any) -> None:
    """Have ``model``'s forward leave ``logits`` out of its output in training mode when labels are given (see
    the module docstring). Set before the Trainer prepares the model, so accelerate's autocast and fp32 output
    conversion wrap this forward and find no logits to convert. Idempotent."""
    forward = model.forward
    if getattr(forward, "_hf_optbench_drops_logits", False):
        return
    inner = forward.__func__ if isinstance(forward, MethodType) else None
    if inner is None:  # an instance forward we do not know how to wrap as a method: leave it
        return

    @functools.wraps(inner)
    def forward_without_training_logits(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = inner(self, *args, **kwargs)
        if self.training and kwargs.get("labels") is not None and getattr(output, "logits", None) is not None:
            return type(output)(**{k: v for k, v in output.items() if k != "logits"})
        return output

    forward_without_training_logits._hf_optbench_drops_logits = True  # type: ignore[attr-defined]
    model.forward = MethodType(forward_without_training_logits, model)


def flops_once(trainer: Any) -> None:
    """The Trainer's ``floating_point_ops`` with the model's parameter count taken once: the same
    ``6 x tokens x num_parameters(exclude_embeddings=True)`` for a model that has ``num_parameters``, 0 otherwise,
    as ``Trainer.floating_point_ops`` computes it."""
    model = trainer.model
    name = getattr(model, "main_input_name", "input_ids")
    params = model.num_parameters(exclude_embeddings=True) if hasattr(model, "num_parameters") else None

    def floating_point_ops(inputs: dict[str, Any]) -> int:
        if params is not None and name in inputs:
            return 6 * inputs[name].numel() * params
        return 0

    trainer.floating_point_ops = floating_point_ops


@contextlib.contextmanager
def start_up_heap_frozen() -> Iterator[None]:
    """Inside: the objects alive at entry are out of the garbage collector's reach (they live for the run anyway;
    what training makes is collected as usual). Unfrozen at exit, unless the process had frozen objects before
    (then they all stay frozen: ``gc.unfreeze`` cannot tell whose they are)."""
    outer = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        yield
    finally:
        if not outer:
            gc.unfreeze()


def package_lookup_once() -> bool:
    """Keep the answer of accelerate's per-step ``is_lomo_available()`` for the process (see the module docstring).
    True when this call bound the cached copy; False when accelerate has no such name there or keeps the answer
    already (a later accelerate, or a second call). Process-wide: the name lives in ``accelerate.optimizer``."""
    import accelerate.optimizer as accelerated_optimizer

    lookup = getattr(accelerated_optimizer, "is_lomo_available", None)
    if lookup is None or hasattr(lookup, "cache_info"):
        return False
    accelerated_optimizer.is_lomo_available = functools.cache(lookup)
    return True
