"""hf_optbench: an optimizer benchmark for pretraining GPT-2 from scratch with Hugging Face Trainer/Accelerate.

The public API is imported lazily (PEP 562) so that ``import hf_optbench`` and the CLI's ``--help`` stay
fast; touching a name imports its module (and torch/transformers) on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from hf_optbench.machine import quiet_deepspeed_cpu_notice

__version__ = "0.1.0"

quiet_deepspeed_cpu_notice()  # before any Trainer imports DeepSpeed (see hf_optbench.machine)

_EXPORTS = {
    "OptBenchError": "errors",
    "build_model": "models",
    "GPT2_SIZES": "models",
    "count_parameters": "models",
    "build_optimizer": "optim.registry",
    "optimizer_defaults": "optim.registry",
    "param_groups": "optim.spec",
    "OPTIMIZERS": "optim.registry",
    "build_scheduler": "optim.schedules",
    "SCHEDULES": "optim.schedules",
    "ScheduleFreeModeCallback": "optim.schedule_free_impl",
    "load_tokenizer": "data.tokenizers",
    "OptBenchRecorder": "measure.recorder",
    "default_callbacks": "measure.recorder",
    "attach_callbacks": "measure.recorder",
    "plan_memory": "measure.planner",
    "parse_args": "config.parse",
    "resolve_plan": "run.plan",
    "trainer_optimizer": "run.trainer",
    "schedule_training_args": "run.trainer",
    "eval_metric_kwargs": "run.eval_metrics",
    "BenchArguments": "config.bench_args",
    "DataArguments": "config.data_args",
    "OptimizerArguments": "config.optim_args",
    "ModelArguments": "config.parse",
    "RunConfig": "config.parse",
    "optimizer_callbacks": "optim.registry",
    "describe_optimizer": "optim.registry",
    "prepare_data": "data.pipeline",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
