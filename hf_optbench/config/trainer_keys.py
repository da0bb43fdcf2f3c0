"""TrainingArguments' own optimizer, schedule and length keys in a recipe, with their Hugging Face meaning.

Why: TRL (``trl sft --config x.yaml``) and alignment-handbook recipes hold TrainingArguments' keys as they are
(``optim: adamw_torch_fused``, ``lr_scheduler_type: cosine``, ``num_train_epochs: 1``, ``warmup_ratio: 0.1``); such a
recipe failed here on its first key. Each is translated, before the recipe is parsed, into hf_optbench's own key
(``optimizer``, ``schedule``, ``schedule_kwargs``, ``max_steps``, ``warmup_steps``), so the optimizer transformers
would build is built through the project's registry (measured, recorded, cited) and the rest of the run is the
same as with hf_optbench's keys. A name hf_optbench cannot build is refused by name; where both spellings of one
setting are given (``optim`` and ``optimizer``...), the run stops naming both. Standard library only: ``validate``
and the run's first checks stay fast.

* ``optim``: :data:`TRANSFORMERS_OPTIM` (transformers 5's ``OptimizerNames`` -> the registry optimizer and the
  constructor arguments that make it the class and kernel ``Trainer.get_optimizer_cls_and_kwargs`` builds;
  ``hf_optbench:<name>``, what a run's own TrainingArguments record, is the registry's ``<name>``). Values the
  recipe leaves unset take the registry's cited defaults for the size (not transformers' 5e-05 and 0.0), as with
  ``optimizer``.
* ``lr_scheduler_type`` / ``lr_scheduler_kwargs``: :data:`TRANSFORMERS_SCHEDULES` and :func:`_schedule_kwargs`.
* ``num_train_epochs``: converted to steps once the training split's size is known
  (:mod:`hf_optbench.run.epochs`: transformers' own rule), recorded in summary.json and config.yaml.
* ``warmup_ratio`` (transformers 4; transformers 5 takes the fraction as ``warmup_steps``): ``warmup_steps``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from hf_optbench.config.bounds import MAX_STEPS
from hf_optbench.config.optim_args import parse_json_mapping
from hf_optbench.errors import OptBenchError, suggest

# TrainingArguments' key -> hf_optbench's key for the same setting (both given: an error naming both).
SPELLINGS: dict[str, str] = {
    "optim": "optimizer",
    "lr_scheduler_type": "schedule",
    "lr_scheduler_kwargs": "schedule_kwargs",
    "num_train_epochs": "max_steps",
    "warmup_ratio": "warmup_steps",
}
# transformers 5 OptimizerNames (training_args.py) -> (registry optimizer, constructor arguments), for the names
# hf_optbench builds as transformers does (trainer_optimizer.py's handlers): adamw_torch lets torch choose its
# kernel (fused=None: foreach on CUDA), adamw_torch_fused asks for the fused one; sgd is plain SGD (momentum 0, as
# transformers builds it without optim_args); adafactor has scale_parameter and relative_step off in both; the
# bitsandbytes names keep 32-bit embedding state in both (transformers' create_optimizer overrides it too).
TRANSFORMERS_OPTIM: dict[str, tuple[str, dict[str, Any]]] = {
    "adamw_torch": ("adamw", {"fused": None}),
    "adamw_torch_fused": ("adamw", {"fused": True}),
    "adafactor": ("adafactor", {}),
    "adamw_bnb_8bit": ("adamw_8bit", {}),
    "adamw_8bit": ("adamw_8bit", {}),
    "paged_adamw_8bit": ("paged_adamw_8bit", {}),
    "lion_32bit": ("lion_32bit", {}),
    "lion_8bit": ("lion_8bit", {}),
    "paged_lion_8bit": ("paged_lion_8bit", {}),
    "sgd": ("sgd", {"momentum": 0.0, "nesterov": False}),
    "adagrad": ("torch.optim.Adagrad", {}),
    "rmsprop": ("torch.optim.RMSprop", {}),
    "schedule_free_adamw": ("schedule_free_adamw", {}),
}
# transformers' SchedulerType -> hf_optbench's schedule of the same curve (optim.schedules: built with the same
# transformers functions).
TRANSFORMERS_SCHEDULES: dict[str, str] = {
    "linear": "linear",
    "cosine": "cosine",
    "cosine_with_min_lr": "gpt3_cosine",
    "warmup_stable_decay": "wsd",
    "constant": "constant",
    "constant_with_warmup": "constant_with_warmup",
}


@dataclass(frozen=True)
class TrainerKeys:
    """The TrainingArguments keys a recipe or command line gave (``given``: key -> value) and what they became
    (``became``: hf_optbench key -> value); ``epochs``: ``num_train_epochs``, turned into steps by the run
    (``epoch_steps``: how, :func:`hf_optbench.run.epochs.with_epoch_steps`)."""

    given: dict[str, Any] = field(default_factory=dict)
    became: dict[str, Any] = field(default_factory=dict)
    epochs: float | None = None
    epoch_steps: dict[str, Any] | None = None

    def record(self) -> dict[str, Any] | None:
        """summary.json's ``trainer_keys``: None when the run was given none of them."""
        if not self.given:
            return None
        return {"given": dict(self.given), "became": dict(self.became), "epoch_steps": self.epoch_steps}


def _take(tokens: list[str], keys: tuple[str, ...]) -> tuple[dict[str, str], list[str]]:
    """The values of ``--key value`` / ``--key=value`` (hyphen spellings too; the last one wins) for ``keys``, and
    the tokens without them."""
    found: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(tokens):
        name, eq, value = tokens[i].partition("=")
        key = name[2:].replace("-", "_") if name.startswith("--") else None
        if key in keys:
            if not eq:
                if i + 1 >= len(tokens):
                    raise OptBenchError(f"--{key} needs a value on the command line.")
                value, i = tokens[i + 1], i + 1
            found[key] = value
        else:
            rest.append(tokens[i])
        i += 1
    return found, rest


def _number(key: str, value: Any, where: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise OptBenchError(f"{key} in {where} must be a number, got {value!r}.") from None


def _optimizer(name: str, where: str) -> tuple[str, dict[str, Any]]:
    name = str(name).strip()
    if name.startswith("hf_optbench:"):  # what a run's own TrainingArguments record
        return name.split(":", 1)[1], {}
    if name in TRANSFORMERS_OPTIM:
        return TRANSFORMERS_OPTIM[name]
    raise OptBenchError(
        f"optim '{name}' (in {where}) is not one of transformers' optimizers hf_optbench builds and measures."
        f"{suggest(name, TRANSFORMERS_OPTIM, cutoff=0.6)} It builds {', '.join(TRANSFORMERS_OPTIM)}; for any other "
        "optimizer use the key optimizer (`hf-optbench optimizers` lists them) or a dotted class path."
    )


def _schedule(name: str, where: str) -> str:
    name = str(name).strip().lower()
    if name not in TRANSFORMERS_SCHEDULES:
        raise OptBenchError(
            f"lr_scheduler_type '{name}' (in {where}) is not one hf_optbench runs.{suggest(name, TRANSFORMERS_SCHEDULES)}"
            f" It runs {', '.join(TRANSFORMERS_SCHEDULES)}; or use the key schedule (`hf-optbench run --help`)."
        )
    return TRANSFORMERS_SCHEDULES[name]


def _schedule_kwargs(schedule: str, kwargs: dict[str, Any], where: str) -> tuple[dict[str, Any], float | None]:
    """(schedule_kwargs, min_lr_ratio or None) of transformers' ``lr_scheduler_kwargs`` for ``schedule``: the floor
    (``min_lr_rate``, wsd's ``min_lr_ratio``) becomes ``min_lr_ratio``; ``num_cycles``, wsd's ``decay_type`` and
    ``warmup_type`` stay; wsd's ``num_decay_steps`` becomes ``decay_ratio`` in :func:`translate` (it needs
    max_steps)."""
    own = {"gpt3_cosine": ("num_cycles",), "cosine": ("num_cycles",), "wsd": ("decay_type", "warmup_type")}
    floors = {"gpt3_cosine": "min_lr_rate", "wsd": "min_lr_ratio"}
    out: dict[str, Any] = {}
    floor = None
    for key, value in kwargs.items():
        if key == floors.get(schedule):
            floor = _number(f"lr_scheduler_kwargs {key}", value, where)
        elif key in own.get(schedule, ()) or (schedule == "wsd" and key == "num_decay_steps"):
            out[key] = value
        else:
            hint = (" Give the floor as min_lr_rate (a fraction of the peak): the peak is the run's resolved "
                    "learning rate." if key == "min_lr" else "")
            takes = ", ".join([*own.get(schedule, ()), *([floors[schedule]] if schedule in floors else [])])
            raise OptBenchError(f"lr_scheduler_kwargs '{key}' (in {where}) is not one hf_optbench's {schedule} takes"
                                f" ({takes or 'none'}).{hint}")
    return out, floor


CLI = "the command line"


def _given(recipe: dict[str, Any], tokens: list[str], recipe_path: str | None
           ) -> tuple[dict[str, tuple[Any, str]], dict[str, Any], list[str], dict[str, str]]:
    """(TrainingArguments key -> (value, where), the recipe without them, the tokens without them, the hf_optbench
    keys given with where): the command line beats the recipe."""
    where_recipe = f"recipe '{recipe_path}'"
    given = {k: (recipe[k], where_recipe) for k in SPELLINGS if recipe.get(k) is not None}
    cli, rest = _take(tokens, tuple(SPELLINGS))
    given.update({k: (v, CLI) for k, v in cli.items()})
    ours = {k: where_recipe for k in recipe if k in SPELLINGS.values() or k == "min_lr_ratio"}
    for tok in rest:
        key = tok[2:].split("=", 1)[0].replace("-", "_") if tok.startswith("--") else None
        if key in SPELLINGS.values() or key == "min_lr_ratio":
            ours[key] = CLI
    return given, {k: v for k, v in recipe.items() if k not in SPELLINGS}, rest, ours


def translate(recipe: dict[str, Any], tokens: list[str], recipe_path: str | None
              ) -> tuple[dict[str, Any], list[str], TrainerKeys]:
    """``recipe`` and command-line ``tokens`` with TrainingArguments' keys of :data:`SPELLINGS` turned into
    hf_optbench's (see the module docstring), and what was translated. OptBenchError for both spellings of one
    setting, a name hf_optbench cannot build, or a value of the wrong kind."""
    given, recipe, tokens, ours = _given(recipe, tokens, recipe_path)
    for key in list(given):  # the two spellings from two places: the command line beats the recipe, as for any key
        mine = SPELLINGS[key]
        if mine in ours and given[key][1] != ours[mine]:
            if given[key][1] == CLI:
                recipe = {k: v for k, v in recipe.items() if k != mine}
                del ours[mine]
            else:
                del given[key]
    if not given:
        return recipe, tokens, TrainerKeys()
    for key in given:
        if SPELLINGS[key] in ours:
            raise OptBenchError(
                f"'{key}' (in {given[key][1]}) and '{SPELLINGS[key]}' (in {ours[SPELLINGS[key]]}) both set the "
                f"{SPELLINGS[key].replace('_', ' ')}: keep one of them.")
    became: dict[str, Any] = {}
    ctor: dict[str, Any] = {}
    if "optim" in given:
        became["optimizer"], ctor = _optimizer(*given["optim"])
    if "lr_scheduler_type" in given:
        became["schedule"] = _schedule(*given["lr_scheduler_type"])
    if "lr_scheduler_kwargs" in given:
        value, where = given["lr_scheduler_kwargs"]
        schedule = became.get("schedule") or recipe.get("schedule") or _cli_value(tokens, "schedule") or "gpt3_cosine"
        kwargs, floor = _schedule_kwargs(schedule, parse_json_mapping("lr_scheduler_kwargs", value), where)
        if floor is not None:
            if "min_lr_ratio" in ours:
                raise OptBenchError(f"lr_scheduler_kwargs (in {where}) and min_lr_ratio (in {ours['min_lr_ratio']}) "
                                    "both set the schedule's floor: keep one of them.")
            became["min_lr_ratio"] = floor
        if "num_decay_steps" in kwargs:
            kwargs["decay_ratio"] = _decay_ratio(kwargs.pop("num_decay_steps"), recipe, tokens, where)
        became["schedule_kwargs"] = kwargs
    if "warmup_ratio" in given:
        ratio = _number("warmup_ratio", *given["warmup_ratio"])
        if not 0.0 <= ratio < 1.0:
            raise OptBenchError(f"warmup_ratio (in {given['warmup_ratio'][1]}) must be in [0, 1), got {ratio}.")
        became["warmup_steps"] = ratio
    epochs = None
    if "num_train_epochs" in given:
        epochs = _number("num_train_epochs", *given["num_train_epochs"])
        if not epochs > 0 or not math.isfinite(epochs):
            raise OptBenchError(f"num_train_epochs (in {given['num_train_epochs'][1]}) must be a positive finite "
                                f"number, got {epochs}.")
        if epochs > MAX_STEPS:  # an epoch is at least one step: the bound max_steps has, before the data is counted
            raise OptBenchError(f"num_train_epochs (in {given['num_train_epochs'][1]}) must be at most {MAX_STEPS:,} "
                                f"(an epoch is at least one optimizer step, and max_steps is at most that), got "
                                f"{epochs:g}. Set the epochs a run can take (e.g. 1).")
    if ctor:
        became["optimizer_kwargs"] = _merged_kwargs(ctor, recipe, tokens, given["optim"])
        tokens = _take(tokens, ("optimizer_kwargs",))[1]
        recipe = {k: v for k, v in recipe.items() if k != "optimizer_kwargs"}
    tokens = tokens + [f"--{k}={json.dumps(v) if isinstance(v, dict) else v}" for k, v in became.items()]
    return recipe, tokens, TrainerKeys({k: v for k, (v, _) in given.items()}, became, epochs)


def _cli_value(tokens: list[str], key: str) -> str | None:
    return _take(tokens, (key,))[0].get(key)


def _decay_ratio(steps: Any, recipe: dict[str, Any], tokens: list[str], where: str) -> float:
    """wsd's ``num_decay_steps`` as hf_optbench's ``decay_ratio`` of the run's ``max_steps``."""
    total = _cli_value(tokens, "max_steps") or recipe.get("max_steps")
    if total is None:
        raise OptBenchError(f"lr_scheduler_kwargs num_decay_steps (in {where}) needs max_steps in the recipe or on the "
                            "command line; or give schedule_kwargs decay_ratio (a fraction of the run) instead.")
    return _number("num_decay_steps", steps, where) / _number("max_steps", total, where)


def _merged_kwargs(ctor: dict[str, Any], recipe: dict[str, Any], tokens: list[str], optim: tuple[Any, str]
                   ) -> dict[str, Any]:
    """The constructor arguments ``optim`` implies, with the optimizer_kwargs the user gave (command line over
    recipe); one argument set by both is an error."""
    text = _cli_value(tokens, "optimizer_kwargs")
    user = parse_json_mapping("optimizer_kwargs", text if text is not None else recipe.get("optimizer_kwargs"))
    clash = sorted(set(user) & set(ctor))
    if clash:
        raise OptBenchError(f"optim '{optim[0]}' (in {optim[1]}) sets the constructor's {clash[0]}={ctor[clash[0]]}, "
                            f"and optimizer_kwargs sets {clash[0]} too: keep one of them.")
    return {**user, **ctor}
