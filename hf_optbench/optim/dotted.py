"""Any torch optimizer class by dotted path ("torch.optim.RAdam", "pytorch_optimizer.AdaBelief"): no cited
defaults and no planner layout, so the learning rate must be set; its arguments are checked against the class
signature when it is built."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import TYPE_CHECKING, Any

from hf_optbench.errors import OptBenchError, suggest
from hf_optbench.optim.spec import param_groups, trainable_params

if TYPE_CHECKING:
    import torch


def is_dotted_path(name: str) -> bool:
    """True for "package.module.Class"-shaped names (the registry's names have no dot)."""
    return "." in name and all(part.isidentifier() for part in name.split("."))


def _explicit_paths() -> set[str]:
    """The directories the user put on the import path on purpose (PYTHONPATH), absolute."""
    return {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}


def import_module_trusted(module_name: str) -> Any:
    """Import ``module_name`` from installed packages and PYTHONPATH only, never implicitly from the working
    directory. Why: ``python -m hf_optbench.run`` puts the working directory first on ``sys.path``, so
    ``--optimizer evil.Opt`` would run a stray ``./evil.py`` while ``hf-optbench run`` (a console script) would not;
    with this rule both entry points import the same modules. To use an optimizer module of one's own, install it
    or put its directory on PYTHONPATH (``PYTHONPATH=. hf-optbench run ... --optimizer my_opt.MyOpt``): a dotted
    path runs that module's code, by design."""
    keep = _explicit_paths()
    cwd = {"", ".", os.getcwd(), os.path.realpath(os.getcwd())}
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if p not in cwd or os.path.abspath(p or ".") in keep]
    try:
        return importlib.import_module(module_name)
    finally:
        sys.path[:] = saved


def _import_optimizer_class(path: str) -> Any:
    import torch

    module_name, _, cls_name = path.rpartition(".")
    try:
        cls = getattr(import_module_trusted(module_name), cls_name)
    except (ImportError, AttributeError) as exc:
        raise OptBenchError(f"optimizer '{path}' could not be imported ({exc}). Check the dotted path; a module of "
                            "your own must be installed or on PYTHONPATH (the working directory is not searched)."
                            ) from exc
    if not (inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer)):
        raise OptBenchError(f"optimizer '{path}' is not a torch.optim.Optimizer subclass.")
    return cls


def constructor_defaults(path: str) -> dict[str, Any]:
    """{argument: default} of the class at ``path``'s constructor (``inspect.empty`` where it has none), past
    ``self`` and ``params``: what a run's plan reads to know, before building, whether the class takes a learning
    rate and a weight decay and which decay it defaults to."""
    params = inspect.signature(_import_optimizer_class(path).__init__).parameters
    return {n: p.default for n, p in params.items() if n not in ("self", "params")
            and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def build_dotted(path: str, model: torch.nn.Module, lr: float | None, weight_decay: float | None,
                 kwargs: dict[str, Any]) -> tuple[Any, str]:
    """Import ``path``, check ``kwargs`` against its constructor (never dropped: a typo is an OptBenchError with a
    close match), and build it over GPT-3 groups when it takes ``weight_decay``."""
    cls = _import_optimizer_class(path)
    named = constructor_defaults(path)
    for key in kwargs:
        if key not in named or key in ("lr", "weight_decay"):
            hint = " (set learning_rate / weight_decay instead)" if key in ("lr", "weight_decay") else \
                suggest(key, named)
            raise OptBenchError(f"optimizer_kwargs '{key}' is not an argument of {path}.{hint} It takes: "
                                f"{', '.join(n for n in named if n not in ('lr', 'weight_decay'))}.")
    if lr is None:
        raise OptBenchError(f"optimizer '{path}' has no cited default learning rate: set learning_rate "
                            "(`hf-optbench find-lr` suggests one).")
    if weight_decay is None:
        default = named.get("weight_decay", inspect.Parameter.empty)
        weight_decay = default if default is not inspect.Parameter.empty else 0.0
    groups = param_groups(model, weight_decay) if "weight_decay" in named else [{"params": trainable_params(model)}]
    opt = cls(groups, lr=lr, **kwargs) if "lr" in named else cls(groups, **kwargs)
    return opt, f"{cls.__module__}.{cls.__qualname__}"
