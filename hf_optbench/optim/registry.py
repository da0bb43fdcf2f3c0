"""The optimizer registry: registry name -> family module's spec, cited defaults per size, building, callbacks.

Each optimizer family lives in one module under ``hf_optbench/optim/`` (``adamw.py``, ``lion.py``,
``bnb8bit.py``, ...) that declares its citations (``CITATIONS``) and its ``SPECS``: defaults per size class,
builder, state layout for the memory planner, Trainer callbacks and aliases (see ``optim/spec.py``). This module
joins them (``FAMILIES``) and holds what they share.

Public API (used by the run layer, config, study):

* ``build_optimizer(name, model, *, lr=None, weight_decay=None, model_size=None, embedding_state_32bit=True,
  **kwargs) -> torch.optim.Optimizer`` -- ``name`` is a registry name (``OPTIMIZERS``) or a dotted path to an
  optimizer class ("torch.optim.RAdam", "pytorch_optimizer.AdaBelief"). ``lr``/``weight_decay`` None -> the cited
  default for ``model_size`` (inferred from the parameter count when None). An argument the optimizer does not
  take raises OptBenchError naming it (with a close match), never dropped. ``build_resolved`` is the same with
  every value given (a run's plan), returning the builder's implementation string beside the optimizer.
* ``optimizer_defaults(name, model_size) -> dict`` -- learning_rate, weight_decay, max_grad_norm, betas, ...,
  ``source`` (one line) and ``sources`` ({key: citation}); ``cited_defaults(spec, size_class)`` for a spec in hand.
* ``spec_of(optimizer)`` -- the registry entry of a built optimizer, read from its class (nothing is stamped on
  the object); ``describe_optimizer(opt, model=...) -> str`` -- implementation string for summary.json.
* ``is_schedule_free(name_or_opt) -> bool``; ``optimizer_callbacks(opt) -> list[TrainerCallback]`` (the
  schedule-free mode switch, Sophia-G's Hessian estimate: each spec's ``callbacks``); ``manual_step_hook(opt)``.
* ``lr_grid(name, model_size, factors=(1/4, 1/2, 1, 2, 4)) -> list[float]`` -- the grid around the default (the
  tuning step's file is read by :mod:`hf_optbench.optim.tuned`).
* ``resolve_optimizer_name(name)`` / ``check_optimizer_kwargs(name_or_spec, kwargs)`` /
  ``check_zero_compatible(name_or_spec, zero_stage)`` -- cheap validation for config. A run resolves the name once
  (``config.optim_args``) and hands the spec on; the functions taking a name resolve it themselves.

Only the standard library is imported at module level (config validation and ``hf-optbench optimizers`` stay
fast); torch and the optimizer packages are imported when an optimizer is built. Size classes come from
``models.SIZE_CLASS`` (one row per model size in models.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import pkgutil
import sys
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from hf_optbench.errors import OptBenchError, suggest
from hf_optbench.models import SIZE_CLASS
from hf_optbench.optim.dotted import build_dotted, is_dotted_path
from hf_optbench.optim.spec import (
    EMBEDDING,
    TRAINING_KEYS,
    OptimizerSpec,
    param_groups,
    round3,
    tensor_roles,
    trainable_params,
)
from hf_optbench.optim.unwrap import innermost_optimizer

if TYPE_CHECKING:
    import torch


# Modules of hf_optbench/optim/ that are not optimizer families; `*_impl` modules hold torch code of a family.
_SHARED_MODULES = frozenset({"registry", "spec", "unwrap", "dotted", "schedules", "tuned", "held"})
# The order `hf-optbench optimizers` lists the families in; families not named here follow alphabetically.
_LISTING_ORDER = ("adamw", "lion", "bnb8bit", "adafactor", "sgd", "schedule_free", "muon", "sophia", "soap")


def _discover_families() -> tuple[ModuleType, ...]:
    """Every family module of this package (a module that declares ``SPECS``): adding an optimizer is adding one
    module, nothing here. Family modules import only the standard library, so this stays fast."""
    import hf_optbench.optim as package

    names = [m.name for m in pkgutil.iter_modules(package.__path__)
             if m.name not in _SHARED_MODULES and not m.name.endswith("_impl")]
    names.sort(key=lambda n: (_LISTING_ORDER.index(n) if n in _LISTING_ORDER else len(_LISTING_ORDER), n))
    modules = [importlib.import_module(f"hf_optbench.optim.{n}") for n in names]
    return tuple(m for m in modules if hasattr(m, "SPECS"))


FAMILIES = _discover_families()

SIZE_CLASSES = ("cpu", "125M", "350M", "760M", "1.3B")
_CLASS_PARAMS = {"125M": 124e6, "350M": 355e6, "760M": 774e6, "1.3B": 1558e6}  # GPT-2 parameter counts


def _collect() -> tuple[dict[str, str], dict[str, OptimizerSpec], dict[str, str]]:
    """(citations, specs by name, alias -> name) from the family modules; a clash is a programming error."""
    citations: dict[str, str] = {}
    specs: dict[str, OptimizerSpec] = {}
    aliases: dict[str, str] = {}
    for family in FAMILIES:
        for key, text in family.CITATIONS.items():
            if key in citations:
                raise RuntimeError(f"citation key '{key}' of {family.__name__} is already used")
            citations[key] = text
        for spec in family.SPECS:
            for name in (spec.name, *spec.aliases):
                if name in specs or name in aliases:
                    raise RuntimeError(f"optimizer name '{name}' of {family.__name__} is already registered")
            specs[spec.name] = spec
            aliases.update(dict.fromkeys(spec.aliases, spec.name))
    return citations, specs, aliases


# CITATIONS: key -> citation text; OPTIMIZERS: name -> spec; ALIASES: the one alias table (alias -> name).
CITATIONS, OPTIMIZERS, ALIASES = _collect()


# --------------------------------------------------------------------------------------------------------------
# Names, sizes, defaults (standard library only)
# --------------------------------------------------------------------------------------------------------------
def resolve_optimizer_name(name: str) -> str:
    """Canonical registry name (aliases allowed) or a dotted class path; OptBenchError listing the names."""
    key = str(name).strip()
    low = key.lower()
    if low in OPTIMIZERS:
        return low
    if low in ALIASES:
        return ALIASES[low]
    if is_dotted_path(key):
        top = key.split(".", 1)[0]
        if importlib.util.find_spec(top) is None:
            raise OptBenchError(f"optimizer '{key}': package '{top}' is not installed. Install it or use a registry "
                                f"name: {', '.join(OPTIMIZERS)}.")
        return key
    raise OptBenchError(
        f"unknown optimizer '{name}'.{suggest(low, list(OPTIMIZERS) + list(ALIASES))} Choose one of: "
        f"{', '.join(OPTIMIZERS)}, or a dotted class path such as torch.optim.RAdam "
        "(`hf-optbench optimizers` lists defaults and sources)."
    )


def size_class(model_size: str) -> str:
    """'cpu' | '125M' | '350M' | '760M' | '1.3B' for a model size name (aliases as in models.resolve_size)."""
    if model_size in SIZE_CLASSES:
        return model_size
    from hf_optbench.models import resolve_size

    return SIZE_CLASS[resolve_size(model_size)]


def size_class_for_params(num_params: int) -> str:
    """Size class for a parameter count: under 50M -> 'cpu', else the nearest GPT-2 size in log space."""
    if num_params < 50e6:
        return "cpu"
    return min(_CLASS_PARAMS, key=lambda c: abs(math.log(num_params / _CLASS_PARAMS[c])))


def optimizer_defaults(name: str, model_size: str) -> dict[str, Any]:
    """Cited defaults of a registry optimizer for a model size: hyperparameters plus ``source`` (one line, the
    citations joined) and ``sources`` ({key: citation}). Dotted paths have none: OptBenchError."""
    canonical = resolve_optimizer_name(name)
    if canonical not in OPTIMIZERS:
        raise OptBenchError(
            f"optimizer '{name}' is a class path, not a registry entry: it has no cited defaults. Set learning_rate "
            "(and weight_decay) yourself, or run `hf-optbench find-lr` to pick one."
        )
    return cited_defaults(OPTIMIZERS[canonical], size_class(model_size))


def cited_defaults(spec: OptimizerSpec, cls: str) -> dict[str, Any]:
    """:func:`optimizer_defaults` of ``spec`` at size class ``cls``. Each key's citation comes from the family's
    :class:`~hf_optbench.optim.spec.CitedDefaults`."""
    cited = spec.defaults(cls)
    sources = {k: CITATIONS[cited.own if k in cited.own_keys else cited.cite] for k in cited.values}
    if cited.also:
        sources = {k: f"{v} | {CITATIONS[cited.also]}" for k, v in sources.items()}
    raw = dict(cited.values, size_class=cls, sources=sources)
    raw["source"] = " | ".join([CITATIONS[cited.cite]] + [CITATIONS[c] for c in (cited.own, cited.also) if c])
    return raw


def lr_grid(name: str, model_size: str, factors: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)) -> list[float]:
    """Learning rates around the cited default for a tuning sweep: default x each factor (by default x1/4 ... x4 in
    factor-2 steps), three significant digits."""
    base = optimizer_defaults(name, model_size)["learning_rate"]
    return [round3(base * f) for f in factors]


def _spec(name_or_spec: str | OptimizerSpec | None) -> OptimizerSpec | None:
    """The spec itself, or a name's (resolved: aliases allowed); None for a dotted path."""
    if name_or_spec is None or isinstance(name_or_spec, OptimizerSpec):
        return name_or_spec
    return OPTIMIZERS.get(resolve_optimizer_name(name_or_spec))


def check_optimizer_kwargs(name_or_spec: str | OptimizerSpec | None, kwargs: dict[str, Any]) -> None:
    """OptBenchError for an argument a registry optimizer does not take (dotted paths are checked at build)."""
    spec = _spec(name_or_spec)
    if spec is None:
        return
    for key in kwargs:
        if key in spec.rejected_kwargs:
            raise OptBenchError(f"optimizer_kwargs '{key}' for {spec.name}: {key} {spec.rejected_kwargs[key]}.")
        if key in ("lr", "weight_decay", "params"):
            raise OptBenchError(
                f"optimizer_kwargs '{key}' for {spec.name}: set it as TrainingArguments' "
                f"{'learning_rate' if key == 'lr' else key} (--{'learning_rate' if key == 'lr' else key}) instead."
            )
        if key not in spec.kwargs:
            raise OptBenchError(
                f"optimizer_kwargs '{key}' is not an argument of {spec.name} ({spec.implementation})."
                f"{suggest(key, list(spec.kwargs))} "
                f"It takes: {', '.join(spec.kwargs) or 'nothing beyond learning_rate/weight_decay'}."
            )


def check_zero_compatible(name_or_spec: str | OptimizerSpec | None, zero_stage: int) -> None:
    """OptBenchError, before any work, for a registry optimizer that cannot run under DeepSpeed ZeRO stage >= 1
    (it hands the optimizer flat 1-D partitions; see measure/planner_zero.py). Dotted paths are not checked."""
    spec = _spec(name_or_spec) if zero_stage else None
    if spec is None or not spec.zero_incompatible:
        return
    ok = [n for n, sp in OPTIMIZERS.items() if not sp.zero_incompatible and not sp.requires_cuda]
    raise OptBenchError(
        f"optimizer '{spec.name}' cannot run under DeepSpeed ZeRO-{zero_stage}: {spec.zero_incompatible}. Use a "
        f"DDP config (accelerate_configs/cpu_ddp2.yaml, a100x4_ddp.yaml) or an optimizer that runs on ZeRO's "
        f"flat partitions: {', '.join(ok)}."
    )


def is_schedule_free(name_or_opt: Any) -> bool:
    """True for a schedule-free optimizer (registry name, spec or object; Accelerate's wrapper is looked
    through)."""
    if isinstance(name_or_opt, (str, OptimizerSpec)):
        spec = _spec(name_or_opt)
        return bool(spec and spec.schedule_free)
    opt = innermost_optimizer(name_or_opt)
    groups = getattr(opt, "param_groups", None) or [{}]
    return callable(getattr(opt, "eval", None)) and callable(getattr(opt, "train", None)) \
        and "train_mode" in groups[0]


# --------------------------------------------------------------------------------------------------------------
# Building (torch imported by the builders)
# --------------------------------------------------------------------------------------------------------------
def model_size_class(model: torch.nn.Module, model_size: str | None) -> str:
    """The size class whose cited values an optimizer of ``model`` takes: ``model_size``'s, else its parameter count's."""
    if model_size is not None:
        return size_class(model_size)
    return size_class_for_params(sum(p.numel() for p in trainable_params(model)))


def _check_device(spec: OptimizerSpec, model: torch.nn.Module) -> None:
    if spec.requires_cuda and not all(p.is_cuda for p in trainable_params(model)):
        raise OptBenchError(
            f"optimizer '{spec.name}' ({spec.implementation}) needs the model on a CUDA GPU (paged optimizer state "
            f"lives in CUDA unified memory); this model is on {next(iter(trainable_params(model))).device}. Use "
            f"'{spec.name.replace('paged_', '')}' on CPU."
        )


def constructor_kwargs(spec: OptimizerSpec, defaults: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The constructor arguments a registry optimizer is built with: its cited values (``defaults``, from
    :func:`cited_defaults`) overlaid by ``kwargs``; lists as tuples (JSON has none)."""
    ctor = {k: v for k, v in defaults.items() if k in spec.kwargs and k not in TRAINING_KEYS}
    ctor.update(kwargs)
    for key in ("betas", "adamw_betas", "ns_coefficients", "eps"):
        if isinstance(ctor.get(key), list):
            ctor[key] = tuple(ctor[key])
    return ctor


def build_resolved(spec: OptimizerSpec | str, model: torch.nn.Module, *, lr: float, weight_decay: float | None,
                   ctor: dict[str, Any], embedding_state_32bit: bool = True) -> tuple[Any, str]:
    """(optimizer, the builder's implementation string) with every value given: a registry ``spec`` is built with
    exactly ``ctor`` (its cited values already in: a run's plan resolved them), a dotted path (``spec`` a str)
    through :func:`~hf_optbench.optim.dotted.build_dotted`. Nothing is filled in and nothing is stamped on the
    optimizer."""
    if not any(True for _ in trainable_params(model)):
        raise OptBenchError("the model has no trainable parameters to optimize.")
    if isinstance(spec, str):
        return build_dotted(spec, model, lr, weight_decay, dict(ctor))
    _check_device(spec, model)
    ctor = dict(ctor)  # builders pop and add keys (Muon's muon_lr, AdamW's fused)
    try:
        return spec.builder(model, param_groups(model, weight_decay or 0.0), lr, ctor, spec=spec,
                            weight_decay=weight_decay, embedding_state_32bit=embedding_state_32bit)
    except OptBenchError:
        raise
    except (TypeError, ValueError) as exc:  # the library's own validation of a value
        raise OptBenchError(f"optimizer '{spec.name}' rejected its arguments {ctor}: {exc}") from exc


def build_optimizer(
    name: str,
    model: torch.nn.Module,
    *,
    lr: float | None = None,
    weight_decay: float | None = None,
    model_size: str | None = None,
    embedding_state_32bit: bool = True,
    **kwargs: Any,
) -> torch.optim.Optimizer:
    """Build optimizer ``name`` over ``model``'s trainable parameters with GPT-3 parameter groups.

    ``lr`` / ``weight_decay`` None take the cited default for ``model_size`` (the size class is inferred from the
    parameter count when ``model_size`` is None). ``kwargs`` are constructor arguments; one the optimizer does not
    take raises OptBenchError. ``embedding_state_32bit`` applies to the bitsandbytes optimizers. What it built is
    read back from the object (:func:`spec_of`, :func:`describe_optimizer`).
    """
    canonical = resolve_optimizer_name(name)
    spec = OPTIMIZERS.get(canonical)
    if spec is None:
        return build_resolved(canonical, model, lr=lr, weight_decay=weight_decay, ctor=kwargs)[0]
    check_optimizer_kwargs(spec, kwargs)
    defaults = cited_defaults(spec, model_size_class(model, model_size))
    explicit = {"learning_rate": lr, "weight_decay": weight_decay}
    given = {*kwargs, *(key for key, value in explicit.items() if value is not None)}  # the caller's values
    lr = defaults["learning_rate"] if lr is None else float(lr)
    weight_decay = defaults["weight_decay"] if weight_decay is None else float(weight_decay)
    if not lr > 0:
        raise OptBenchError(f"learning_rate must be positive, got {lr}.")
    ctor = constructor_kwargs(spec, defaults, kwargs)
    sources = {key: CALLER_SOURCE if key in given else defaults["sources"].get(key, CITATIONS.get(key, ""))
               for key in ("learning_rate", "weight_decay", *ctor)}
    for key, (value, why) in (spec.resolve_auto(model, ctor) if spec.resolve_auto is not None else {}).items():
        ctor[key], sources[key] = value, f"{why} | {sources.get(key, '')}"
    optimizer = build_resolved(spec, model, lr=lr, weight_decay=weight_decay, ctor=ctor,
                               embedding_state_32bit=embedding_state_32bit)[0]
    _BUILT_SOURCES[innermost_optimizer(optimizer)] = sources
    return optimizer


def built_sources(optimizer: Any) -> dict[str, str] | None:
    """Where each value of an optimizer :func:`build_optimizer` made came from ({key: source}: the caller, the
    cited default with its citation, or an ``auto`` with its reason), decided when it was built; None for an
    optimizer it did not build (a Trainer's own, the caller's)."""
    try:
        return _BUILT_SOURCES.get(innermost_optimizer(optimizer))
    except TypeError:  # an object that takes no weak reference was not built here
        return None


# The Python API's optimizers by object, weakly (never kept alive by this table): where their values came from,
# read by optim.held.held_record. Nothing is stamped on the optimizer itself.
_BUILT_SOURCES: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()
# The source of a value the caller passed to build_optimizer.
CALLER_SOURCE = "set by the caller (not the cited default)"


def spec_of(optimizer: Any) -> OptimizerSpec | None:
    """The registry entry of a built optimizer (inside any wrapper), read from its class: a family's own class
    (``hf_optbench.optim.<family>_impl``) belongs to that family's single spec, a library class to the spec whose
    ``implementation`` names it. None for a class no entry names (a dotted path) or several do."""
    cls = type(innermost_optimizer(optimizer))
    found = [spec for spec in OPTIMIZERS.values() if _names_class(spec, cls)]
    return found[0] if len(found) == 1 else None


def _names_class(spec: OptimizerSpec, cls: type) -> bool:
    family = spec.builder.__module__
    if cls.__module__ == f"{family}_impl":
        return sum(1 for s in OPTIMIZERS.values() if s.builder.__module__ == family) == 1
    module_name, _, name = spec.implementation.rpartition(".")
    module = sys.modules.get(module_name)  # a class of a package never imported cannot be this object's
    return module is not None and getattr(module, name, None) is cls


def describe_optimizer(opt: Any, *, built: str | None = None, model: torch.nn.Module | None = None) -> str:
    """Implementation string for summary.json, e.g. "torch.optim.AdamW(fused=True)", "bitsandbytes.optim.
    AdamW8bit(embedding fp32)"; for optimizers not in the registry, module.Class. ``built``: the builder's string
    (:func:`build_resolved`), else it is composed from the object. It states what the optimizer holds now: the
    spec's ``describe`` reads the state's dtypes, and, given the ``model`` it was built over, "[ZeRO flat
    partitions]" marks an optimizer whose parameters DeepSpeed replaced with flat 1-D partitions."""
    inner = innermost_optimizer(opt)
    spec = spec_of(inner)
    if spec is None:
        return built or f"{type(inner).__module__}.{type(inner).__qualname__}"
    impl = built or _implementation(spec, inner)
    model_ids = {id(p) for p in trainable_params(model)} if model is not None else set()
    held = {id(p) for g in getattr(inner, "param_groups", []) for p in g.get("params", [])}
    flattened = bool(model_ids) and bool(held) and not (held & model_ids)
    if spec.describe is not None:
        embeddings = frozenset(k for k, role in tensor_roles(model).items() if role == EMBEDDING) \
            if model is not None else frozenset()
        return spec.describe(inner, impl, flattened, embedding_ids=embeddings)
    return f"{impl} [ZeRO flat partitions]" if flattened else impl


def _implementation(spec: OptimizerSpec, inner: Any) -> str:
    """The spec's implementation with the kernel the object chose (torch's ``fused`` / ``foreach`` defaults)."""
    defaults = getattr(inner, "defaults", {}) or {}
    mode = "fused=True" if defaults.get("fused") else "foreach=True" if defaults.get("foreach") else None
    return f"{spec.implementation}({mode})" if mode else spec.implementation


def manual_step_hook(opt: Any) -> Callable[..., None] | None:
    """What a loop outside the Trainer runs after each step (the spec's ``manual_step``: Sophia-G's Hessian)."""
    spec = spec_of(opt)
    return spec.manual_step if spec is not None else None


def optimizer_callbacks(opt: Any) -> list[Any]:
    """The TrainerCallbacks an optimizer needs (its spec's ``callbacks``: the train/eval switch for schedule-free
    ones, the Hessian estimate for Sophia-G). An optimizer not built from the registry (a dotted path) that follows
    the schedule-free train/eval protocol gets the mode switch too. Add them last (after the measuring callbacks).
    ``opt`` may be a registry name, for a Trainer that builds the optimizer itself (``trainer_optimizer(name)``):
    its callbacks must be there before; a dotted path needs the built optimizer."""
    if isinstance(opt, str):
        spec = OPTIMIZERS.get(resolve_optimizer_name(opt))
        return spec.callbacks() if spec is not None and spec.callbacks else []
    spec = spec_of(opt)
    if spec is not None:
        return spec.callbacks() if spec.callbacks else []
    if not is_schedule_free(opt):
        return []
    from hf_optbench.optim import schedule_free

    return schedule_free.mode_callbacks()
