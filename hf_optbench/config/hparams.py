"""Learning rate, weight decay and clipping the user did not set, filled from a tuned file or the optimizer
registry's cited defaults. Shared by a run, a sweep's pre-flight check and find-lr, so all three agree."""

from __future__ import annotations

from typing import Any

from hf_optbench.config.parse import RunConfig
from hf_optbench.errors import OptBenchError


def resolve_hyperparameters(cfg: RunConfig) -> dict[str, Any]:
    """Fill learning_rate / weight_decay / max_grad_norm the user did not set: tuned file first (its learning rate;
    its weight decay where the tuning phase tuned it, for optimizers whose spec sets ``tune_weight_decay``: source
    "tuned: <file>" for each value the file gave), else the optimizer registry's cited default for this model size.
    Returns {key: {"value", "source"}} for the summary, with the optimizer's betas / eps beside them."""
    from hf_optbench.optim.dotted import is_dotted_path
    from hf_optbench.optim.registry import optimizer_defaults
    from hf_optbench.optim.tuned import lookup_tuned

    if is_dotted_path(cfg.optim.optimizer):
        # No cited default exists for an arbitrary class: transformers' 5e-5 must not apply silently.
        if "learning_rate" not in cfg.explicit:
            raise OptBenchError(
                f"optimizer '{cfg.optim.optimizer}' is a dotted path with no cited default learning rate: set "
                "--learning_rate (e.g. find one with `hf-optbench find-lr RECIPE`)."
            )
        defaults: dict[str, Any] = {}
    else:
        defaults = optimizer_defaults(cfg.optim.optimizer, cfg.model.model_size)
    tuned = {}
    if cfg.optim.tuned_hparams_file:
        tuned = lookup_tuned(cfg.optim.tuned_hparams_file, cfg.optim.optimizer, cfg.model.model_size,
                             max_steps=cfg.training.max_steps) or {}
    chosen: dict[str, Any] = {}
    for key in ("learning_rate", "weight_decay", "max_grad_norm"):
        if key in cfg.explicit:
            chosen[key] = {"value": getattr(cfg.training, key), "source": "user"}
        elif key in tuned:
            setattr(cfg.training, key, tuned[key])
            chosen[key] = {"value": tuned[key], "source": f"tuned: {cfg.optim.tuned_hparams_file}"}
        elif key in defaults:
            setattr(cfg.training, key, defaults[key])
            chosen[key] = {"value": defaults[key], "source": defaults.get("source", "registry default")}
        else:
            chosen[key] = {"value": getattr(cfg.training, key), "source": "transformers default"}
    chosen.update(_constructor_sources(cfg, defaults))
    chosen.update(_tuned_constructor_values(cfg, defaults, tuned))
    return chosen


def _tuned_constructor_values(cfg: RunConfig, defaults: dict[str, Any], tuned: dict[str, Any]) -> dict[str, Any]:
    """The tuned constructor arguments (``optim.tuned.CONSTRUCTOR_KEYS``: a parameter group's learning-rate ratio)
    the optimizer takes: the user's optimizer_kwargs first, else the tuned file's (added to the constructor
    arguments), else the citation; each with its source."""
    from hf_optbench.optim.registry import OPTIMIZERS
    from hf_optbench.optim.tuned import CONSTRUCTOR_KEYS

    spec = OPTIMIZERS.get(cfg.optim.optimizer)
    kwargs, out = cfg.optim.kwargs(), {}
    for key in (k for k in CONSTRUCTOR_KEYS if spec is not None and k in spec.kwargs):
        if key in kwargs:
            out[key] = {"value": kwargs[key], "source": "user"}
        elif key in tuned:
            cfg.optim.add_kwargs({key: tuned[key]})
            out[key] = {"value": tuned[key], "source": f"tuned: {cfg.optim.tuned_hparams_file}"}
        elif key in defaults:
            out[key] = {"value": defaults[key], "source": defaults.get("sources", {}).get(key, "registry default")}
    return out


def _constructor_sources(cfg: RunConfig, defaults: dict[str, Any]) -> dict[str, Any]:
    """betas / eps with their source: "user" when set through adam_beta1/adam_beta2/adam_epsilon (honoured for
    the AdamW family by config.checks.apply_adam_arguments) or optimizer_kwargs, else the registry's citation."""
    kwargs = cfg.optim.kwargs()
    out: dict[str, Any] = {}
    for name in ("betas", "eps"):
        if name in kwargs:
            out[name] = {"value": kwargs[name], "source": "user"}
        elif name in defaults:
            out[name] = {"value": defaults[name], "source": defaults.get("sources", {}).get(name, "registry default")}
    return out
