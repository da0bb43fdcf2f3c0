"""The optimizer zoo: registry name -> library implementation, GPT-3 parameter groups, cited defaults per size.

Public API (used by run.py, lr_finder.py, tuning):

* ``build_optimizer(name, model, *, lr=None, weight_decay=None, model_size=None, embedding_state_32bit=True,
  **kwargs) -> torch.optim.Optimizer`` -- ``name`` is a registry name (``OPTIMIZERS``) or a dotted path to an
  optimizer class ("torch.optim.RAdam", "pytorch_optimizer.AdaBelief"). ``lr``/``weight_decay`` None -> the cited
  default for ``model_size`` (inferred from the parameter count when None). An argument the optimizer does not
  take raises OptBenchError naming it (with a close match), never dropped.
* ``optimizer_defaults(name, model_size) -> dict`` -- learning_rate, weight_decay, max_grad_norm, betas, ...,
  warmup (``warmup_tokens`` for GPT-2 sizes, ``warmup_steps`` for the CPU sizes), ``source`` (one line) and
  ``sources`` ({key: citation}).
* ``param_groups(model, weight_decay) -> list[dict]`` -- weight decay on >=2-D tensors only (GPT-3 / nanoGPT).
* ``describe_optimizer(opt) -> str`` -- implementation string for summary.json.
* ``is_schedule_free(name_or_opt) -> bool``; ``optimizer_callbacks(opt) -> list[TrainerCallback]`` (the
  schedule-free mode switch, Sophia-G's Hessian estimate).
* ``lookup_tuned(path, optimizer, model_size) -> dict`` -- the tuned values file written by the tuning step;
  ``lr_grid(name, model_size, factors=(1/4, 1/2, 1, 2, 4)) -> list[float]`` -- the grid around the default.
* ``resolve_optimizer_name(name)`` / ``check_optimizer_kwargs(name, kwargs)`` -- cheap validation for config.py.
* ``cli_main(argv)`` -- ``hf-optbench optimizers [--size gpt2-medium] [--json]``.

Only the standard library is imported at module level (config validation and ``hf-optbench optimizers`` stay
fast); torch and the optimizer packages are imported when an optimizer is built.

Size classes: the CPU sizes tiny/mini/midi have no published GPT-2 recipe, so they use nanoGPT's settings for its
10M-parameter "baby GPT" (karpathy/nanoGPT config/train_shakespeare_char.py); gpt2 / gpt2-medium / gpt2-large use
GPT-3's 125M / 350M / 760M rows (Brown et al. 2020, Table 2.1) and gpt2-xl (1.5B) the nearest row, 1.3B.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import OptBenchError

if TYPE_CHECKING:
    import torch

# --------------------------------------------------------------------------------------------------------------
# Citations (one place, referenced by key below)
# --------------------------------------------------------------------------------------------------------------
CITATIONS: dict[str, str] = {
    "gpt3": "Brown et al. 2020, Language Models are Few-Shot Learners, Table 2.1 (peak LR per size) and Appendix B "
            "(Adam betas (0.9, 0.95), eps 1e-8, weight decay 0.1, clip 1.0, 375M-token linear warmup, cosine to 10%)",
    "nanogpt_small": "karpathy/nanoGPT config/train_shakespeare_char.py (baby GPT: lr 1e-3, beta2 0.99, 100 warmup "
                     "iters, min_lr = lr/10) and train.py (weight_decay 0.1, grad_clip 1.0)",
    "lion": "Chen et al. 2023, Symbolic Discovery of Optimization Algorithms, Sec. 5 (lr 3-10x smaller and decoupled "
            "weight decay 3-10x larger than AdamW; default betas (0.9, 0.99)); lucidrains/lion-pytorch README "
            "(updates 3-4: 3x smaller than AdamW beat AdamW on LM, 10x was worst) -> lr = AdamW/3, wd = AdamW*3",
    "bnb8bit": "Dettmers et al. 2022, 8-bit Optimizers via Block-wise Quantization (ICLR): same hyperparameters as "
               "the 32-bit optimizer; 32-bit state for embeddings for stability",
    "adafactor": "Shazeer & Stern 2018, Adafactor (decay_rate -0.8, clip_threshold 1.0, eps (1e-30, 1e-3), beta1 "
                 "None = no first moment); transformers Adafactor docs (external LR: scale_parameter=False, "
                 "relative_step=False, warmup_init=False). No published GPT-2 Adafactor LR: AdamW's GPT-3 value is "
                 "used (with parameter scaling off the step is Adam-sized) -- tune it",
    "sgd": "No published GPT-2 pretraining recipe for SGD. momentum 0.9 + Nesterov (Sutskever et al. 2013); lr 0.1 "
           "is Goyal et al. 2017's ImageNet base rate, a starting point only -- run find-lr / the tuning grid",
    "schedule_free": "Defazio et al. 2024, The Road Less Scheduled; facebookresearch/schedule_free README "
                     "(beta 0.9; AdamW LR 1x-10x the scheduled one -> 1x GPT-3's; warmup via the optimizer; no LR "
                     "schedule). beta2 0.95 and weight decay 0.1 as GPT-3 for comparability",
    "muon": "KellerJordan/Muon README (momentum 0.95, nesterov, ns_steps 5; AdamW for embeddings/head/gains); "
            "Liu et al. 2025, Muon is Scalable for LLM Training, arXiv:2502.16982 Sec. 2.2 (adjust_lr_fn "
            "match_rms_adamw: reuse AdamW's LR and weight decay 0.1)",
    "sophia": "Liu et al. 2023, Sophia (arXiv:2305.14342); Liuhong99/Sophia sophia.py (betas (0.965, 0.99), "
              "eps 1e-15), README 'Hyper-parameter Tuning' (rho 0.03 at 125M; (lr, rho) = (5e-4, 0.05) at 355M; "
              "weight decay 0.2) and config/train_gpt2_{small,medium,large}_sophiag.py (lr 3e-4 / 5e-4 / 3e-4, "
              "interval k=10, clip 1.0)",
    "soap": "Vyas et al. 2024, SOAP (arXiv:2409.11321); nikhilvyas/SOAP README (lr 3e-3, betas (0.95, 0.95), "
            "weight_decay 0.01, precondition_frequency 10); no per-size table published",
}

# GPT-3 Table 2.1 peak learning rates; GPT-2 sizes mapped to the nearest GPT-3 row.
_GPT3_LR = {"125M": 6.0e-4, "350M": 3.0e-4, "760M": 2.5e-4, "1.3B": 2.0e-4}
SIZE_CLASS = {"tiny": "cpu", "mini": "cpu", "midi": "cpu", "gpt2": "125M", "gpt2-medium": "350M",
              "gpt2-large": "760M", "gpt2-xl": "1.3B"}
SIZE_CLASSES = ("cpu", "125M", "350M", "760M", "1.3B")
_CLASS_PARAMS = {"125M": 124e6, "350M": 355e6, "760M": 774e6, "1.3B": 1558e6}  # GPT-2 parameter counts


def _adamw_base(size_class: str) -> dict[str, Any]:
    """AdamW's cited hyperparameters for a size class (the base several optimizers derive from)."""
    if size_class == "cpu":
        return {"learning_rate": 1e-3, "weight_decay": 0.1, "betas": (0.9, 0.99), "eps": 1e-8,
                "max_grad_norm": 1.0, "warmup_steps": 100, "_cite": "nanogpt_small"}
    return {"learning_rate": _GPT3_LR[size_class], "weight_decay": 0.1, "betas": (0.9, 0.95), "eps": 1e-8,
            "max_grad_norm": 1.0, "warmup_tokens": 375_000_000, "_cite": "gpt3"}


def _round(x: float) -> float:
    """Three significant digits: a derived default reads 2e-4, not 1.9999999999999998e-4."""
    return float(f"{x:.3g}")


def _d_adamw(c: str) -> dict[str, Any]:
    return _adamw_base(c)




def _d_lion(c: str) -> dict[str, Any]:
    base = _adamw_base(c)
    d = {k: v for k, v in base.items() if k not in ("betas", "eps")}
    d.update(learning_rate=_round(base["learning_rate"] / 3), weight_decay=_round(base["weight_decay"] * 3),
             betas=(0.9, 0.99),
             _cite=base["_cite"], _extra_cite="lion", _derived=("learning_rate", "weight_decay", "betas"))
    return d


def _d_8bit(base: Callable[[str], dict[str, Any]]) -> Callable[[str], dict[str, Any]]:
    """Defaults of an 8-bit bitsandbytes variant: the 32-bit optimizer's own values, with the 8-bit paper cited on
    every key beside the 32-bit optimizer's sources (the paper keeps the 32-bit hyperparameters)."""

    def defaults(c: str) -> dict[str, Any]:
        d = base(c)
        d["_also_cite"] = "bnb8bit"
        return d

    return defaults


def _d_adafactor(c: str) -> dict[str, Any]:
    base = _adamw_base(c)
    d = {k: v for k, v in base.items() if k not in ("betas", "eps")}
    d.update(beta1=None, decay_rate=-0.8, clip_threshold=1.0, eps=(1e-30, 1e-3), _extra_cite="adafactor",
             _derived=("beta1", "decay_rate", "clip_threshold", "eps", "learning_rate"))
    return d


def _d_sgd(c: str) -> dict[str, Any]:
    base = _adamw_base(c)
    return {"learning_rate": 0.1, "weight_decay": 0.0, "momentum": 0.9, "nesterov": True,
            "max_grad_norm": base["max_grad_norm"], **{k: v for k, v in base.items() if k.startswith("warmup")},
            "_cite": base["_cite"], "_extra_cite": "sgd", "_derived": ("learning_rate", "weight_decay", "momentum",
                                                                      "nesterov")}


def _d_schedule_free(c: str) -> dict[str, Any]:
    d = _adamw_base(c)
    d.update(_extra_cite="schedule_free", _derived=("learning_rate",))
    return d


def _d_muon(c: str) -> dict[str, Any]:
    d = _adamw_base(c)
    d["adamw_betas"], d["adamw_eps"] = d.pop("betas"), d.pop("eps")  # the auxiliary AdamW's (as our AdamW's)
    d.update(momentum=0.95, nesterov=True, ns_steps=5, adjust_lr_fn="match_rms_adamw", _extra_cite="muon",
             _derived=("momentum", "nesterov", "ns_steps", "adjust_lr_fn", "learning_rate", "weight_decay"))
    return d


# Sophia repository configs: (lr, rho) per GPT-2 size; weight decay 0.2, betas (0.965, 0.99), k = 10.
_SOPHIA = {"125M": (3e-4, 0.03), "350M": (5e-4, 0.05), "760M": (3e-4, 0.05)}


def _d_sophia(c: str) -> dict[str, Any]:
    base = _adamw_base(c)
    # CPU sizes take the smallest published (125M) values; gpt2-xl the largest (770M): none published beyond.
    lr, rho = _SOPHIA.get(c, _SOPHIA["125M"] if c == "cpu" else _SOPHIA["760M"])
    d = {k: v for k, v in base.items() if k not in ("betas", "eps", "learning_rate", "weight_decay")}
    d.update(learning_rate=lr, weight_decay=0.2, betas=(0.965, 0.99), rho=rho, update_period=10, eps=1e-15,
             _extra_cite="sophia", _derived=("learning_rate", "weight_decay", "betas", "rho", "update_period",
                                             "eps"))
    return d


def _d_soap(c: str) -> dict[str, Any]:
    base = _adamw_base(c)
    d = {k: v for k, v in base.items() if k not in ("betas", "eps", "learning_rate", "weight_decay")}
    d.update(learning_rate=3e-3, weight_decay=0.01, betas=(0.95, 0.95), precondition_frequency=10,
             _extra_cite="soap", _derived=("learning_rate", "weight_decay", "betas", "precondition_frequency"))
    return d


@dataclass(frozen=True)
class OptimizerSpec:
    """One registry entry. ``kwargs`` lists the extra constructor arguments accepted (checked without importing the
    library; tests check each against the library's signature). ``defaults(size_class)`` gives the cited values."""

    name: str
    implementation: str
    builder: str
    defaults: Callable[[str], dict[str, Any]]
    kwargs: tuple[str, ...]
    description: str
    package: str = "torch"
    requires_cuda: bool = False
    schedule_free: bool = False
    needs_tuning: bool = False
    rejected_kwargs: dict[str, str] = field(default_factory=dict)


_ADAFACTOR_EXTERNAL_LR = "is fixed: the benchmark drives Adafactor's LR with an external schedule " \
                         "(relative_step=False, warmup_init=False)"

OPTIMIZERS: dict[str, OptimizerSpec] = {
    spec.name: spec
    for spec in (
        OptimizerSpec("adamw", "torch.optim.AdamW", "_build_adamw", _d_adamw,
                      ("betas", "eps", "amsgrad", "fused", "foreach", "capturable"),
                      "AdamW (Loshchilov & Hutter 2019); fused kernel where torch has one for the device (CUDA and "
                      "CPU), else foreach"),
        OptimizerSpec("lion", "lion_pytorch.Lion", "_build_lion", _d_lion,
                      ("betas", "use_triton", "decoupled_weight_decay"),
                      "Lion (Chen et al. 2023), lucidrains' per-tensor loop; use_triton=True needs CUDA + triton",
                      package="lion-pytorch"),
        OptimizerSpec("lion_foreach", "lion_pytorch.foreach.Lion", "_build_lion_foreach", _d_lion,
                      ("betas", "decoupled_weight_decay"),
                      "the same Lion update with torch._foreach ops (lion-pytorch's own foreach variant)",
                      package="lion-pytorch"),
        OptimizerSpec("adamw_8bit", "bitsandbytes.optim.AdamW8bit", "_build_bnb", _d_8bit(_d_adamw),
                      ("betas", "eps", "amsgrad", "min_8bit_size"),
                      "block-wise 8-bit AdamW state (Dettmers et al. 2022); embedding state 32-bit unless "
                      "embedding_state_32bit=false", package="bitsandbytes"),
        OptimizerSpec("paged_adamw_8bit", "bitsandbytes.optim.PagedAdamW8bit", "_build_bnb", _d_8bit(_d_adamw),
                      ("betas", "eps", "amsgrad", "min_8bit_size"),
                      "8-bit AdamW with state in CUDA unified (paged) memory", package="bitsandbytes",
                      requires_cuda=True),
        OptimizerSpec("lion_8bit", "bitsandbytes.optim.Lion8bit", "_build_bnb", _d_8bit(_d_lion),
                      ("betas", "min_8bit_size"),
                      "block-wise 8-bit Lion state (bitsandbytes); embedding state 32-bit unless "
                      "embedding_state_32bit=false", package="bitsandbytes"),
        OptimizerSpec("paged_lion_8bit", "bitsandbytes.optim.PagedLion8bit", "_build_bnb", _d_8bit(_d_lion),
                      ("betas", "min_8bit_size"),
                      "8-bit Lion with state in CUDA unified (paged) memory", package="bitsandbytes",
                      requires_cuda=True),
        OptimizerSpec("adafactor", "transformers.optimization.Adafactor", "_build_adafactor", _d_adafactor,
                      ("eps", "clip_threshold", "decay_rate", "beta1", "scale_parameter"),
                      "Adafactor (Shazeer & Stern 2018): factored second moment, no first moment by default, "
                      "external LR schedule", package="transformers", needs_tuning=True,
                      rejected_kwargs={"relative_step": _ADAFACTOR_EXTERNAL_LR,
                                       "warmup_init": _ADAFACTOR_EXTERNAL_LR, "lr": "is learning_rate"}),
        OptimizerSpec("sgd", "torch.optim.SGD", "_build_sgd", _d_sgd,
                      ("momentum", "dampening", "nesterov", "foreach", "fused"),
                      "SGD with Nesterov momentum; no published GPT-2 recipe (tune the LR first)",
                      needs_tuning=True),
        OptimizerSpec("schedule_free_adamw", "schedulefree.AdamWScheduleFree", "_build_schedule_free",
                      _d_schedule_free, ("betas", "eps", "warmup_steps", "r", "weight_lr_power", "foreach"),
                      "Schedule-free AdamW (Defazio et al. 2024): no LR schedule; optimizer.train()/eval() around "
                      "evaluation and checkpoints (ScheduleFreeModeCallback)", package="schedulefree",
                      schedule_free=True),
        OptimizerSpec("muon", "torch.optim.Muon+torch.optim.AdamW", "_build_muon", _d_muon,
                      ("momentum", "nesterov", "ns_steps", "ns_coefficients", "adjust_lr_fn", "muon_lr",
                       "adamw_betas", "adamw_eps"),
                      "Muon (Jordan et al. 2024) on hidden 2-D matrices, AdamW on embeddings, head and 1-D tensors"),
        OptimizerSpec("sophia", "hf_optbench.sophia.SophiaG", "_build_sophia", _d_sophia,
                      ("betas", "rho", "update_period", "eps"),
                      "Sophia-G (Liu et al. 2023): pytorch_optimizer.SophiaH's clipped update fed with the "
                      "Gauss-Newton-Bartlett Hessian estimate every k steps (SophiaGHessianCallback)",
                      package="pytorch-optimizer"),
        OptimizerSpec("soap", "pytorch_optimizer.SOAP", "_build_soap", _d_soap,
                      ("betas", "shampoo_beta", "eps", "precondition_frequency", "max_precondition_dim",
                       "merge_dims", "precondition_1d", "correct_bias", "normalize_gradient"),
                      "SOAP (Vyas et al. 2024): Adam in Shampoo's eigenbasis (pytorch-optimizer)",
                      package="pytorch-optimizer"),
    )
}

ALIASES = {"adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_fused": "adamw",
           "lion_pytorch": "lion", "adamw8bit": "adamw_8bit", "adamw_bnb_8bit": "adamw_8bit",
           "lion8bit": "lion_8bit", "adamw_schedulefree": "schedule_free_adamw", "sf_adamw": "schedule_free_adamw",
           "sophiag": "sophia", "sophia_g": "sophia", "sgd_momentum": "sgd"}

# keys of optimizer_defaults() that are not constructor arguments
_TRAINING_KEYS = ("learning_rate", "weight_decay", "max_grad_norm", "warmup_steps", "warmup_tokens")


# --------------------------------------------------------------------------------------------------------------
# Names, sizes, defaults (standard library only)
# --------------------------------------------------------------------------------------------------------------
def _suggest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else ""


def is_dotted_path(name: str) -> bool:
    return "." in name and all(part.isidentifier() for part in name.split("."))


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
        f"unknown optimizer '{name}'.{_suggest(low, list(OPTIMIZERS) + list(ALIASES))} Choose one of: "
        f"{', '.join(OPTIMIZERS)}, or a dotted class path such as torch.optim.RAdam "
        "(`hf-optbench optimizers` lists defaults and sources)."
    )


def size_class(model_size: str) -> str:
    """'cpu' | '125M' | '350M' | '760M' | '1.3B' for a model size name (aliases as in models.resolve_size)."""
    if model_size in SIZE_CLASSES:
        return model_size
    from .models import resolve_size  # models imports only the standard library at module level

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
    cls = size_class(model_size)
    raw = OPTIMIZERS[canonical].defaults(cls)
    cite, extra = raw.pop("_cite"), raw.pop("_extra_cite", None)
    also = raw.pop("_also_cite", None)  # cited on every key (the 8-bit variants)
    derived = set(raw.pop("_derived", ()))
    sources = {k: CITATIONS[extra] if k in derived else CITATIONS[cite] for k in raw}
    if also:
        sources = {k: f"{v} | {CITATIONS[also]}" for k, v in sources.items()}
    raw["size_class"] = cls
    raw["sources"] = sources
    raw["source"] = " | ".join([CITATIONS[cite]] + [CITATIONS[c] for c in (extra, also) if c])
    return raw


def lr_grid(name: str, model_size: str, factors: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)) -> list[float]:
    """Learning rates around the cited default for a tuning sweep: default x each factor (by default x1/4 ... x4 in
    factor-2 steps, the grid the tuning protocol of issue 5 asks for), three significant digits."""
    base = optimizer_defaults(name, model_size)["learning_rate"]
    return [_round(base * f) for f in factors]


def check_optimizer_kwargs(name: str, kwargs: dict[str, Any]) -> None:
    """OptBenchError for an argument a registry optimizer does not take (dotted paths are checked at build)."""
    canonical = resolve_optimizer_name(name)
    spec = OPTIMIZERS.get(canonical)
    if spec is None:
        return
    for key in kwargs:
        if key in spec.rejected_kwargs:
            raise OptBenchError(f"optimizer_kwargs '{key}' for {canonical}: {key} {spec.rejected_kwargs[key]}.")
        if key in ("lr", "weight_decay", "params"):
            raise OptBenchError(
                f"optimizer_kwargs '{key}' for {canonical}: set it as TrainingArguments' "
                f"{'learning_rate' if key == 'lr' else key} (--{'learning_rate' if key == 'lr' else key}) instead."
            )
        if key not in spec.kwargs:
            raise OptBenchError(
                f"optimizer_kwargs '{key}' is not an argument of {canonical} ({spec.implementation}).{_suggest(key, list(spec.kwargs))} "
                f"It takes: {', '.join(spec.kwargs) or 'nothing beyond learning_rate/weight_decay'}."
            )


def is_schedule_free(name_or_opt: Any) -> bool:
    """True for a schedule-free optimizer (registry name or object; Accelerate's wrapper is looked through)."""
    if isinstance(name_or_opt, str):
        canonical = resolve_optimizer_name(name_or_opt)
        return bool(OPTIMIZERS.get(canonical) and OPTIMIZERS[canonical].schedule_free)
    opt = _unwrap(name_or_opt)
    groups = getattr(opt, "param_groups", None) or [{}]
    return callable(getattr(opt, "eval", None)) and callable(getattr(opt, "train", None)) \
        and "train_mode" in groups[0]


def lookup_tuned(path: str, optimizer: str, model_size: str) -> dict[str, Any]:
    """The tuned values for (optimizer, model_size) in a YAML/JSON file {optimizer: {model_size: {...}}}, as
    written by the tuning step; {} when the file has no entry for them. Names and sizes may be aliases."""
    import os

    if not os.path.isfile(path):
        raise OptBenchError(f"tuned_hparams_file '{path}' does not exist. Write it with `hf-optbench tune`.")
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        if path.endswith(".json"):
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # noqa: BLE001 - YAML and JSON raise different types
        raise OptBenchError(f"tuned_hparams_file '{path}' could not be parsed: {exc}") from exc
    if not isinstance(data, dict):
        raise OptBenchError(f"tuned_hparams_file '{path}' must map optimizer -> size -> values.")
    want_opt = resolve_optimizer_name(optimizer)
    want_size = _canonical_size(model_size)
    for opt_name, by_size in data.items():
        try:
            if resolve_optimizer_name(str(opt_name)) != want_opt:
                continue
        except OptBenchError:
            continue
        if not isinstance(by_size, dict):
            raise OptBenchError(f"tuned_hparams_file '{path}': entry '{opt_name}' must map model_size -> values.")
        for size, values in by_size.items():
            if _canonical_size(str(size)) == want_size:
                if not isinstance(values, dict):
                    raise OptBenchError(f"tuned_hparams_file '{path}': {opt_name}/{size} must be a mapping.")
                return {k: _number(v) for k, v in values.items()}
    return {}


def _number(value: Any) -> Any:
    """YAML 1.1 reads 3e-4 (no dot) as a string: take numeric strings as floats."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _canonical_size(size: str) -> str:
    from .models import resolve_size

    try:
        return resolve_size(size)
    except OptBenchError:
        return str(size)


# --------------------------------------------------------------------------------------------------------------
# Building (torch imported here)
# --------------------------------------------------------------------------------------------------------------
def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """GPT-3 / nanoGPT groups: weight decay on tensors with >= 2 dims (matmul weights, embeddings), none on biases,
    LayerNorm gains and other 1-D tensors. Tied weights appear once. Empty groups are left out."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():  # remove_duplicate=True: the tied wte/lm_head weight once
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": float(weight_decay)}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def _unwrap(opt: Any) -> Any:
    """The optimizer inside Accelerate's AcceleratedOptimizer (and similar wrappers)."""
    seen = 0
    while hasattr(opt, "optimizer") and opt.optimizer is not opt and seen < 5:
        inner = opt.optimizer
        if not hasattr(inner, "param_groups"):
            break
        opt, seen = inner, seen + 1
    return opt


def _params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _fused_ok(params: list[torch.nn.Parameter]) -> bool:
    """torch has a fused AdamW kernel for every param's device (CUDA, CPU, MPS, XPU, ...) and dtype. On CPU the
    fused kernel took 0.089 s vs 0.666 s for foreach on a 124M parameter set (STACK-FACTS; benchmarks/
    bench_optimizer_step.py measures it again), so fused is chosen wherever it exists."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    devices = set(_get_fused_kernels_supported_devices())
    return bool(params) and all(p.device.type in devices and p.is_floating_point() for p in params)


def _build_adamw(model, groups, lr, ctor, **_):
    import torch

    if "fused" not in ctor and "foreach" not in ctor:
        if _fused_ok(_params(model)):
            ctor["fused"] = True
        else:
            ctor["foreach"] = True
    opt = torch.optim.AdamW(groups, lr=lr, **ctor)
    mode = "fused=True" if opt.defaults.get("fused") else "foreach=True" if opt.defaults.get("foreach") else \
        "single-tensor"
    return opt, f"torch.optim.AdamW({mode})"


def _build_lion(model, groups, lr, ctor, **_):
    from lion_pytorch import Lion

    if ctor.get("use_triton"):
        # lion_pytorch.triton calls exit() when triton is missing (STACK-FACTS): check first.
        if importlib.util.find_spec("triton") is None or not all(p.is_cuda for p in _params(model)):
            raise OptBenchError("optimizer_kwargs use_triton=true needs CUDA parameters and the triton package; "
                                "drop it (the default per-tensor update) or run on a GPU with triton installed.")
    opt = Lion(groups, lr=lr, **ctor)
    return opt, "lion_pytorch.Lion(triton)" if ctor.get("use_triton") else "lion_pytorch.Lion"


def _build_lion_foreach(model, groups, lr, ctor, **_):
    from lion_pytorch.foreach import Lion

    return Lion(groups, lr=lr, **ctor), "lion_pytorch.foreach.Lion"


def _build_bnb(model, groups, lr, ctor, spec, embedding_state_32bit, **_):
    import bitsandbytes as bnb
    import torch

    cls = getattr(bnb.optim, spec.implementation.rsplit(".", 1)[1])
    manager = bnb.optim.GlobalOptimManager.get_instance()
    # The manager is process-global and keyed by id(param): drop entries a freed tensor may have left under an id
    # one of ours now reuses, then mark the embeddings (the library's own per-parameter override).
    for p in _params(model):
        manager.pid2config.pop(id(p), None)
    if embedding_state_32bit:
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding) and module.weight.requires_grad:
                manager.override_config(module.weight, "optim_bits", 32)
    opt = cls(groups, lr=lr, **ctor)
    emb = "embedding fp32" if embedding_state_32bit else "embedding 8-bit"
    return opt, f"{spec.implementation}({emb})"


def _build_adafactor(model, groups, lr, ctor, **_):
    from transformers.optimization import Adafactor

    ctor.setdefault("scale_parameter", False)
    opt = Adafactor(groups, lr=lr, relative_step=False, warmup_init=False, **ctor)
    return opt, f"transformers.Adafactor(beta1={ctor.get('beta1')}, external lr)"


def _build_sgd(model, groups, lr, ctor, **_):
    import torch

    opt = torch.optim.SGD(groups, lr=lr, **ctor)
    return opt, f"torch.optim.SGD(momentum={opt.defaults['momentum']}, nesterov={opt.defaults['nesterov']})"


def _build_schedule_free(model, groups, lr, ctor, **_):
    from schedulefree import AdamWScheduleFree

    return AdamWScheduleFree(groups, lr=lr, **ctor), "schedulefree.AdamWScheduleFree"


def _build_muon(model, groups, lr, ctor, weight_decay, **_):

    from .muon import MuonWithAuxAdamW, split_muon_params

    muon_lr = ctor.pop("muon_lr", None)
    adamw_betas = ctor.pop("adamw_betas", (0.9, 0.95))
    adamw_eps = ctor.pop("adamw_eps", 1e-8)
    if ctor.get("adjust_lr_fn") in (None, "original") and muon_lr is None:
        raise OptBenchError(
            "muon with adjust_lr_fn 'original' takes its LR in spectral units (Keller Jordan's README: 0.02), not "
            "AdamW's: set optimizer_kwargs muon_lr (e.g. 0.02), or keep adjust_lr_fn 'match_rms_adamw'."
        )
    hidden, _ = split_muon_params(model)
    hidden_ids = {id(p) for p in hidden}
    muon_groups, adamw_groups = [], []
    for g in groups:
        mine = [p for p in g["params"] if id(p) in hidden_ids]
        rest = [p for p in g["params"] if id(p) not in hidden_ids]
        if mine:
            muon_groups.append({**g, "params": mine, "lr": muon_lr if muon_lr is not None else lr})
        if rest:
            adamw_groups.append({**g, "params": rest, "lr": lr})
    adamw_kwargs: dict[str, Any] = {"lr": lr, "betas": tuple(adamw_betas), "eps": adamw_eps}
    if _fused_ok(_params(model)):
        adamw_kwargs["fused"] = True
    opt = MuonWithAuxAdamW(muon_groups, adamw_groups, muon_kwargs={"lr": lr, **ctor}, adamw_kwargs=adamw_kwargs)
    aux = "fused=True" if adamw_kwargs.get("fused") else "foreach"
    return opt, (f"torch.optim.Muon(adjust_lr_fn={ctor.get('adjust_lr_fn')})+torch.optim.AdamW({aux}) "
                 f"[{len(hidden)} hidden matrices on Muon]")


def _build_sophia(model, groups, lr, ctor, **_):
    from .sophia import SophiaG

    opt = SophiaG(groups, lr=lr, **ctor)
    return opt, f"hf_optbench.sophia.SophiaG(pytorch_optimizer.SophiaH update, GNB Hessian every " \
                f"{opt.gnb_update_period} steps)"


def _build_soap(model, groups, lr, ctor, **_):
    from pytorch_optimizer import SOAP

    return SOAP(groups, lr=lr, **ctor), "pytorch_optimizer.SOAP"


def _model_size_class(model: torch.nn.Module, model_size: str | None) -> str:
    if model_size is not None:
        return size_class(model_size)
    return size_class_for_params(sum(p.numel() for p in _params(model)))


def _check_device(spec: OptimizerSpec, model: torch.nn.Module) -> None:
    if spec.requires_cuda and not all(p.is_cuda for p in _params(model)):
        raise OptBenchError(
            f"optimizer '{spec.name}' ({spec.implementation}) needs the model on a CUDA GPU (paged optimizer state "
            f"lives in CUDA unified memory); this model is on {next(iter(_params(model))).device}. Use "
            f"'{spec.name.replace('paged_', '')}' on CPU."
        )


def _build_dotted(path: str, model, lr, weight_decay, kwargs):
    import torch

    module_name, _, cls_name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError) as exc:
        raise OptBenchError(f"optimizer '{path}' could not be imported ({exc}). Check the dotted path.") from exc
    if not (inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer)):
        raise OptBenchError(f"optimizer '{path}' is not a torch.optim.Optimizer subclass.")
    params = inspect.signature(cls.__init__).parameters
    named = [n for n, p in params.items() if n not in ("self", "params")
             and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    for key in kwargs:
        if key not in named or key in ("lr", "weight_decay"):
            hint = " (set learning_rate / weight_decay instead)" if key in ("lr", "weight_decay") else \
                _suggest(key, named)
            raise OptBenchError(f"optimizer_kwargs '{key}' is not an argument of {path}.{hint} It takes: "
                                f"{', '.join(n for n in named if n not in ('lr', 'weight_decay'))}.")
    if lr is None:
        raise OptBenchError(f"optimizer '{path}' has no cited default learning rate: set learning_rate "
                            "(`hf-optbench find-lr` suggests one).")
    if weight_decay is None:
        wd_param = params.get("weight_decay")
        weight_decay = wd_param.default if wd_param is not None and wd_param.default is not inspect._empty else 0.0
    groups = param_groups(model, weight_decay) if "weight_decay" in named else [{"params": _params(model)}]
    opt = cls(groups, lr=lr, **kwargs) if "lr" in named else cls(groups, **kwargs)
    return opt, f"{cls.__module__}.{cls.__qualname__}"


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
    take raises OptBenchError. ``embedding_state_32bit`` applies to the bitsandbytes optimizers. The result carries
    ``hf_optbench_impl`` (see :func:`describe_optimizer`) and ``hf_optbench_name``.
    """
    canonical = resolve_optimizer_name(name)
    if not any(True for _ in _params(model)):
        raise OptBenchError("the model has no trainable parameters to optimize.")
    if canonical not in OPTIMIZERS:
        opt, impl = _build_dotted(canonical, model, lr, weight_decay, dict(kwargs))
    else:
        spec = OPTIMIZERS[canonical]
        check_optimizer_kwargs(canonical, kwargs)
        _check_device(spec, model)
        defaults = optimizer_defaults(canonical, _model_size_class(model, model_size))
        lr = defaults["learning_rate"] if lr is None else float(lr)
        weight_decay = defaults["weight_decay"] if weight_decay is None else float(weight_decay)
        if not lr > 0:
            raise OptBenchError(f"learning_rate must be positive, got {lr}.")
        ctor = {k: v for k, v in defaults.items() if k in spec.kwargs and k not in _TRAINING_KEYS}
        ctor.update(kwargs)
        for key in ("betas", "adamw_betas", "ns_coefficients", "eps"):
            if isinstance(ctor.get(key), list):  # JSON has no tuples
                ctor[key] = tuple(ctor[key])
        builder = getattr(sys.modules[__name__], spec.builder)
        try:
            opt, impl = builder(model, param_groups(model, weight_decay), lr, ctor, spec=spec,
                                weight_decay=weight_decay, embedding_state_32bit=embedding_state_32bit)
        except OptBenchError:
            raise
        except (TypeError, ValueError) as exc:  # the library's own validation of a value
            raise OptBenchError(f"optimizer '{canonical}' rejected its arguments {ctor}: {exc}") from exc
    opt.hf_optbench_impl = impl
    opt.hf_optbench_name = canonical
    opt.hf_optbench_lr = lr  # the learning_rate asked for (groups may differ: Muon's own muon_lr)
    return opt


def describe_optimizer(opt: Any) -> str:
    """Implementation string for summary.json, e.g. "torch.optim.AdamW(fused=True)",
    "bitsandbytes.optim.AdamW8bit(embedding fp32)"; for optimizers not built here, module.Class."""
    inner = _unwrap(opt)
    impl = getattr(inner, "hf_optbench_impl", None)
    if impl:
        return impl
    return f"{type(inner).__module__}.{type(inner).__qualname__}"


def optimizer_callbacks(opt: Any) -> list[Any]:
    """The TrainerCallbacks an optimizer needs: the train/eval switch for schedule-free ones, the Hessian estimate
    for Sophia-G. Add them last (after the measuring callbacks)."""
    callbacks: list[Any] = []
    inner = _unwrap(opt)
    if is_schedule_free(inner):
        from .schedule_free import ScheduleFreeModeCallback

        callbacks.append(ScheduleFreeModeCallback())
    if type(inner).__name__ == "SophiaG":
        from .sophia import SophiaGHessianCallback

        callbacks.append(SophiaGHessianCallback())
    return callbacks


# --------------------------------------------------------------------------------------------------------------
# hf-optbench optimizers
# --------------------------------------------------------------------------------------------------------------
def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, tuple):
        return "(" + ", ".join(_fmt(v) for v in value) + ")"
    return str(value)


def cli_main(argv: list[str] | None = None) -> int:
    """``hf-optbench optimizers [--size SIZE] [--json]``: names, implementations, cited defaults and sources."""
    import argparse

    parser = argparse.ArgumentParser(prog="hf-optbench optimizers", description=cli_main.__doc__)
    parser.add_argument("--size", default="gpt2", help="model size whose defaults to show (default gpt2)")
    parser.add_argument("--json", action="store_true", help="print JSON (all fields, with full citations)")
    args = parser.parse_args(argv)
    rows = []
    for name, spec in OPTIMIZERS.items():
        d = optimizer_defaults(name, args.size)
        rows.append({"name": name, "implementation": spec.implementation, "package": spec.package,
                     "requires_cuda": spec.requires_cuda, "schedule_free": spec.schedule_free,
                     "needs_tuning": spec.needs_tuning, "description": spec.description, "defaults": d})
    if args.json:
        print(json.dumps({"size": args.size, "size_class": size_class(args.size), "optimizers": rows},
                         indent=2, default=list))
        return 0
    print(f"Defaults for model size '{args.size}' (size class {size_class(args.size)}); `--json` for citations.\n")
    header = ("name", "implementation", "lr", "wd", "betas / other", "notes")
    table = []
    for r in rows:
        d = r["defaults"]
        other = _fmt(d["betas"]) if "betas" in d else ", ".join(
            f"{k}={_fmt(d[k])}" for k in ("momentum", "beta1", "adjust_lr_fn") if k in d)
        if "rho" in d:
            other += f", rho={_fmt(d['rho'])}"
        notes = ", ".join(n for n, on in (("CUDA only", r["requires_cuda"]), ("no schedule", r["schedule_free"]),
                                          ("tune first", r["needs_tuning"])) if on)
        table.append((r["name"], r["implementation"], _fmt(d["learning_rate"]), _fmt(d["weight_decay"]), other,
                      notes))
    widths = [max(len(str(row[i])) for row in [header, *table]) for i in range(len(header))]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=False)))
    print("  ".join("-" * w for w in widths))
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)))
    print("\nSources:")
    for key, text in CITATIONS.items():
        print(f"  [{key}] {text}")
    print("\nAny torch.optim or pytorch_optimizer class also works by dotted path (e.g. torch.optim.RAdam); it has "
          "no cited default, so set learning_rate.")
    return 0
