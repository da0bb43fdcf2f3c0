"""hf_optbench: an optimizer benchmark for pretraining GPT-2 from scratch with Hugging Face Trainer/Accelerate.

The public API is imported lazily (PEP 562) so that ``import hf_optbench`` and the CLI's ``--help`` stay
fast; touching a name imports its module (and torch/transformers) on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "OptBenchError": "errors",
    "build_model": "models",
    "GPT2_SIZES": "models",
    "count_parameters": "models",
    "build_optimizer": "optimizers",
    "optimizer_defaults": "optimizers",
    "param_groups": "optimizers",
    "OPTIMIZERS": "optimizers",
    "build_scheduler": "schedules",
    "SCHEDULES": "schedules",
    "ScheduleFreeModeCallback": "schedule_free",
    "load_tokenizer": "tokenization",
    "build_datasets": "data",
    "OptBenchRecorder": "callbacks",
    "default_callbacks": "callbacks",
    "plan_memory": "memory",
    "parse_args": "config",
    "OptBenchTrainer": "trainer",
    "BenchArguments": "bench_config",
    "DataArguments": "data_config",
    "OptimizerArguments": "optim_config",
    "ModelArguments": "config",
    "RunConfig": "config",
    "optimizer_callbacks": "optimizers",
    "describe_optimizer": "optimizers",
    "prepare_data": "data",
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
