"""Find the optimizer that holds the state inside the wrappers a Trainer puts around it.

Accelerate's ``AcceleratedOptimizer`` and DeepSpeed's ``DeepSpeedZeroOptimizer`` (stages 1-2),
``DeepSpeedZeroOptimizer_Stage3`` and ``BF16_Optimizer`` all keep the optimizer they drive in ``.optimizer``; so do
hf_optbench's own composite optimizers' callers. One owner for the walk, so every caller stops at the same place.
"""

from __future__ import annotations

from typing import Any


def optimizer_chain(optimizer: Any) -> list[Any]:
    """The chain of wrappers down to the optimizer that holds ``.state``: [outermost, ..., innermost].

    Under ZeRO the innermost one was built on this rank's flat fp32 partition, so its ``.state`` is exactly the
    partition of the moments this rank holds.
    """
    chain = [optimizer]
    while True:
        inner = getattr(chain[-1], "optimizer", None)
        if inner is None or inner is chain[-1] or inner in chain or not hasattr(inner, "param_groups"):
            return chain
        chain.append(inner)


def innermost_optimizer(optimizer: Any) -> Any:
    """The optimizer at the bottom of :func:`optimizer_chain` (the object itself when it wraps nothing)."""
    return optimizer_chain(optimizer)[-1]
