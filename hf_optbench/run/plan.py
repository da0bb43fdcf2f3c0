"""One run's plan: the recipe, the command line, a tuned file and the defaults resolved once, validated once, into
a frozen record of what the run will do, which everything downstream takes and nothing writes back into.

Why: a value resolved in one place and re-derived in others (the learning rate travelled from the parsed
arguments into the registry, onto the optimizer, back into TrainingArguments and three times into summary.json) can
be labelled with one value while another runs, and each new record was another chance for that. Here each value is
resolved once, with its source:

* the optimizer: its canonical name, ``learning_rate``, ``weight_decay``, every constructor argument the builder
  gets (cited, tuned or the user's) and each parameter group's rate and decay, from the family's group layouts
  (``OptimizerSpec.groups``: Muon's matrices at ``muon_lr`` when set); :func:`what_ran` holds the optimizer the
  registry builds to it;
* ``max_grad_norm``; the schedule (``optim.schedules.resolve_schedule``'s record);
* the batch: micro-batch, accumulation, processes, block size and the tokens per step;
* the data, with a fingerprint of its content (the files' bytes and the tokenizer's, not their paths), and the
  model's shape; the resume request (``config.parse.ResumeRequest``, parsed once).

The plan's identity (:attr:`RunPlan.identity`, hashed into :attr:`RunPlan.plan_hash`) is every resolved value that
changes what is trained; it goes into every checkpoint (:mod:`hf_optbench.run.identity`). TrainingArguments for the
Trainer (:meth:`RunPlan.trainer_args`), config.yaml, summary.json, the trackers and the card are rendered from it.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from hf_optbench.config.parse import ResumeRequest, RunConfig
from hf_optbench.errors import OptBenchError
from hf_optbench.optim.spec import GPT3_GROUPS, SINGLE_GROUP, GroupLayout, OptimizerSpec
from hf_optbench.rundir import portable_path

if TYPE_CHECKING:
    import torch

# The TrainingArguments fields that change what is trained (an allow-list: TrainingArguments holds ~120 fields,
# most of them about logging, saving and publishing). Not adam_beta1/adam_beta2/adam_epsilon: the plan folds the
# ones set into the optimizer's constructor values (below), elsewhere they are refused.
TRAINING_KEYS = (
    "max_steps", "warmup_steps", "seed", "data_seed", "full_determinism", "per_device_train_batch_size",
    "gradient_accumulation_steps", "average_tokens_across_devices", "label_smoothing_factor", "neftune_noise_alpha",
    "bf16", "fp16", "tf32", "gradient_checkpointing", "torch_compile", "dataloader_drop_last",
    "train_sampling_strategy", "fsdp",
)
# Fields of hf_optbench's own argument dataclasses that do not change what is trained (every other one does, so a
# new field is part of the identity unless it is listed here).
OWN_KEYS_IGNORED = frozenset({
    "overwrite_output_dir", "require_clean_git", "write_model_card", "save_final_model",  # RunArguments
    "model_card_license",  # RunArguments: what the card states, not what is trained
    "skip_memory_check",  # RunArguments: whether the memory check may stop the run, not what it trains
    "num_processes",  # RunArguments: a check of the launch; the world size itself is in the identity
    "preprocessing_num_workers", "data_cache_dir", "overwrite_data_cache",  # DataArguments: how, not what
    "data_files",  # where the text is; its content is the data fingerprint
    "tuned_hparams_file",  # a path; the values it gave are resolved into learning_rate / weight_decay
    "optimizer_kwargs",  # how the constructor values were asked for; the values are optimizer_constructor
    "target_losses", "eval_target_losses", "target_smoothing_steps", "spike_window", "spike_threshold",
    "spike_min_history", "timing_warmup_steps", "measure_memory", "device_peak_tflops",
    "metrics_flush_every",  # BenchArguments: what is measured about the run, not the run
})
# The source of a group's weight decay where GPT-3's groups leave it out.
NO_DECAY_SOURCE = ("GPT-3 / nanoGPT parameter groups: no weight decay on biases and LayerNorm gains "
                   "(optim.spec.param_groups)")
TRANSFORMERS_DEFAULT = "transformers default"


@dataclass(frozen=True)
class Sourced:
    """A resolved value and where it came from: "user", "tuned: <file>", a citation, or a default's owner."""

    value: Any
    source: str

    def entry(self) -> dict[str, Any]:
        return {"value": _plain(self.value), "source": self.source}


@dataclass(frozen=True)
class GroupPlan:
    """One parameter group as the family's builder makes it (:class:`~hf_optbench.optim.spec.GroupLayout`): its
    tensor roles, its learning rate and weight decay (None: the class's own, a dotted path without one)."""

    name: str
    roles: tuple[str, ...]
    lr: Sourced
    weight_decay: Sourced | None


@dataclass(frozen=True)
class OptimizerPlan:
    """The optimizer: canonical ``name`` (registry name or dotted path), its ``spec`` (None for a dotted path),
    ``learning_rate``, ``weight_decay``, ``constructor`` ({argument: Sourced}: exactly what the builder gets) and
    ``groups``."""

    name: str
    spec: OptimizerSpec | None
    learning_rate: Sourced
    weight_decay: Sourced
    constructor: Mapping[str, Sourced]
    groups: tuple[GroupPlan, ...]
    embedding_state_32bit: bool

    def constructor_values(self) -> dict[str, Any]:
        return {k: v.value for k, v in self.constructor.items()}


@dataclass(frozen=True)
class BatchPlan:
    """What one optimizer step sees. Field names as TrainingArguments', so ``models.tokens_per_step`` reads it."""

    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    world_size: int
    block_size: int

    @property
    def tokens_per_step(self) -> int:
        from hf_optbench.models import tokens_per_step

        return tokens_per_step(self, self.block_size)


@dataclass(frozen=True)
class DataPlan:
    """The data: its source and a SHA-256 of its content (``kind`` "files": each text file's bytes in reading order
    and the tokenizer directory's files; "hub": the dataset's name, config and split, read as immutable;
    "synthetic": generated from the settings, which the identity holds)."""

    source: str
    kind: str
    fingerprint: str
    files: int


@dataclass(frozen=True)
class ModelPlan:
    model_size: str
    size_class: str
    n_positions: int


@dataclass(frozen=True)
class RunPlan:
    """Everything one run will do, resolved once (see the module docstring). ``args`` are the parsed arguments the
    plan was resolved from: read for what the plan does not restate (data options, the Trainer's own settings),
    never written."""

    args: RunConfig
    optimizer: OptimizerPlan
    max_grad_norm: Sourced
    schedule: Mapping[str, Any]
    batch: BatchPlan
    data: DataPlan
    model: ModelPlan
    resume: ResumeRequest
    zero_stage: int
    identity: Mapping[str, Any]
    plan_hash: str

    @property
    def max_steps(self) -> int:
        return int(self.args.training.max_steps)

    def hyperparameters(self) -> dict[str, dict[str, Any]]:
        """{key: {"value", "source"}}: learning_rate, weight_decay, max_grad_norm and every constructor argument."""
        out = {"learning_rate": self.optimizer.learning_rate.entry(),
               "weight_decay": self.optimizer.weight_decay.entry(), "max_grad_norm": self.max_grad_norm.entry()}
        out.update({k: v.entry() for k, v in self.optimizer.constructor.items()})
        return out

    def trainer_args(self, record: Mapping[str, Any]) -> Any:
        """The TrainingArguments to hand the Trainer: a copy of the parsed ones with the fields hf_optbench replaces
        rendered from the plan (``record``: :func:`plan_record`): the optimizer's label, rate, decay and betas, the
        clipping, and the transformers scheduler type that computes the plan's schedule (the Trainer builds it, also
        after DeepSpeed's re-initialisation). The parsed arguments are left as they were."""
        from hf_optbench.optim.held import training_args_fields
        from hf_optbench.optim.schedules import training_args_for_schedule

        args = copy.copy(self.args.training)
        for key, value in training_args_fields(record).items():
            setattr(args, key, value)
        fields = training_args_for_schedule(dict(self.schedule))
        if fields is None:  # one_cycle: handed to the Trainer as the object (run.train.build_optimization)
            args.lr_scheduler_type = f"hf_optbench:{self.schedule['name']}"
        else:
            from transformers.trainer_utils import SchedulerType

            args.lr_scheduler_type = SchedulerType(fields["lr_scheduler_type"])
            args.lr_scheduler_kwargs = fields["lr_scheduler_kwargs"]
            args.warmup_steps = fields["warmup_steps"]
        return args


def _plain(value: Any) -> Any:
    """JSON's view of a value (tuples as lists), so a stored identity compares equal to a fresh one."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


# ---------------------------------------------------------------------------------------------------- resolving
def _training_value(cfg: RunConfig, key: str, tuned: Mapping[str, Any], tuned_file: str | None,
                    cited: Mapping[str, Any]) -> Sourced:
    """learning_rate / weight_decay / max_grad_norm: the user's, else the tuned file's, else the registry's
    citation for the size, else transformers' default."""
    if key in cfg.explicit:
        return Sourced(getattr(cfg.training, key), "user")
    if key in tuned:
        return Sourced(tuned[key], f"tuned: {portable_path(tuned_file, cfg.training.output_dir)}")
    if key in cited:
        return Sourced(cited[key], cited["sources"].get(key, cited["source"]))
    return Sourced(getattr(cfg.training, key), TRANSFORMERS_DEFAULT)


def _check_value(key: str, entry: Sourced) -> None:
    """Whatever its source, a resolved value is what the command line would accept: a finite learning rate > 0,
    weight decay and clipping >= 0 (a tuned file's max_grad_norm -5 is refused, not recorded as tuned)."""
    value = entry.value
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and (value > 0 if key == "learning_rate" else value >= 0)
    if not ok:
        where = "" if entry.source == "user" else f" (from {entry.source.split(' | ')[0][:120]})"
        rule = "a finite number > 0" if key == "learning_rate" else "a finite number >= 0"
        raise OptBenchError(f"{key} {value!r}{where} must be {rule}. Fix it where it was set, or set --{key}.")


def _dotted_defaults(cfg: RunConfig) -> tuple[dict[str, Any], bool]:
    """(defaults, whether the class takes a weight decay) of a dotted path: it has no citation, so its learning rate
    must be set; its weight decay is the class's own default."""
    import inspect

    from hf_optbench.optim.dotted import constructor_defaults

    if "learning_rate" not in cfg.explicit:
        raise OptBenchError(
            f"optimizer '{cfg.optim.optimizer}' is a dotted path with no cited default learning rate: set "
            "--learning_rate (e.g. find one with `hf-optbench find-lr RECIPE`)."
        )
    named = constructor_defaults(cfg.optim.optimizer)
    wd = named.get("weight_decay", inspect.Parameter.empty)
    out: dict[str, Any] = {"sources": {}, "source": "the class's own default"}
    if wd is not inspect.Parameter.empty and wd is not None:
        out["weight_decay"] = float(wd)
    return out, "weight_decay" in named


def _constructor(cfg: RunConfig, spec: OptimizerSpec | None, cited: Mapping[str, Any],
                 tuned: Mapping[str, Any] | None = None, tuned_file: str | None = None) -> dict[str, Sourced]:
    """Every constructor argument the builder gets: the user's optimizer_kwargs and adam_* (AdamW family), over the
    tuned file's constructor values (``optim.tuned.CONSTRUCTOR_KEYS``: a parameter group's tuned rate ratio), over
    the registry's cited values. Lists as tuples, as the builders take them."""
    from hf_optbench.config.checks import adam_constructor, check_betas_length, check_optimizer_values
    from hf_optbench.optim.registry import constructor_kwargs
    from hf_optbench.optim.tuned import CONSTRUCTOR_KEYS

    user = cfg.optim.kwargs()
    if "betas" in cited:  # adam_* are refused at parse for every optimizer without Adam's betas
        user.update(adam_constructor(cfg.training, cfg.explicit, tuple(cited["betas"])))
    check_optimizer_values(user)
    check_betas_length(cfg.optim.optimizer, user)
    from_file = {k: (tuned or {})[k] for k in CONSTRUCTOR_KEYS
                 if spec is not None and k in spec.kwargs and k in (tuned or {}) and k not in user}
    given = {**from_file, **user}
    values = constructor_kwargs(spec, cited, given) if spec is not None else dict(user)

    def source(k: str) -> str:
        if k in user:
            return "user"
        if k in from_file:
            return f"tuned: {portable_path(tuned_file, cfg.training.output_dir)}"
        return cited["sources"].get(k, cited.get("source", ""))

    return {k: Sourced(v, source(k)) for k, v in values.items()}


def _groups(layouts: tuple[GroupLayout, ...], lr: Sourced, wd: Sourced | None,
            ctor: Mapping[str, Sourced]) -> tuple[GroupPlan, ...]:
    """Each group's rate and decay: its layout's own constructor argument where set, else the run's."""
    out = []
    for layout in layouts:
        g_lr = ctor[layout.lr_kwarg] if layout.lr_kwarg and layout.lr_kwarg in ctor else lr
        ratio = ctor.get(layout.lr_ratio_kwarg) if layout.lr_ratio_kwarg else None
        if g_lr is lr and ratio is not None and float(ratio.value) != 1.0:  # the builder's own product, exactly
            g_lr = Sourced(lr.value * float(ratio.value),
                           f"learning_rate x {layout.lr_ratio_kwarg} {ratio.value:g} ({ratio.source})")
        if not layout.decay:
            g_wd = Sourced(0.0, NO_DECAY_SOURCE) if wd is not None else None
        else:
            g_wd = ctor[layout.wd_kwarg] if layout.wd_kwarg and layout.wd_kwarg in ctor else wd
        out.append(GroupPlan(layout.name, layout.roles, g_lr, g_wd))
    return tuple(out)


def train_device(cfg: RunConfig) -> str:
    """"cuda" or "cpu": where a run of ``cfg`` trains on this machine (a GPU unless there is none or ``use_cpu``)."""
    import torch

    return "cuda" if torch.cuda.is_available() and not getattr(cfg.training, "use_cpu", False) else "cpu"


def _resolve_ns_precision(cfg: RunConfig, spec: OptimizerSpec | None, ctor: dict[str, Sourced]) -> None:
    """Muon's Newton-Schulz precision, ``auto`` resolved here, once, for the device the run trains on
    (``optim.muon.resolve_ns_precision``): on a CPU timed on the model's own matrices, the measurement cached in the
    data cache directory; its source then says why (both timings, or the capability read) beside the citation. A
    forced bf16/fp32 keeps its own source."""
    from hf_optbench.models import GPT2_SIZES
    from hf_optbench.optim.muon import NS_KEY, resolve_ns_precision
    from hf_optbench.optim.muon_precision import gpt2_matrix_shapes

    entry = ctor.get(NS_KEY)
    if spec is None or NS_KEY not in spec.kwargs or entry is None:
        return
    size = GPT2_SIZES[cfg.model.model_size]
    precision, why = resolve_ns_precision(entry.value, train_device(cfg),
                                          shapes=gpt2_matrix_shapes(size["n_layer"], size["n_embd"]),
                                          cache_dir=cfg.data.resolved_cache_dir())
    ctor[NS_KEY] = entry if precision == entry.value else Sourced(precision, f"{why} | {entry.source}")


def _schedule(cfg: RunConfig, spec: OptimizerSpec | None, ctor: dict[str, Sourced]) -> dict[str, Any]:
    """The schedule record; a schedule-free optimizer runs "none" and its warmup becomes its own constructor
    argument (``warmup_steps`` of schedulefree.AdamWScheduleFree)."""
    from hf_optbench.optim.schedules import resolve_schedule

    schedule_free = bool(spec is not None and spec.schedule_free)
    record = resolve_schedule("none" if schedule_free else cfg.optim.schedule,
                              num_training_steps=cfg.training.max_steps, warmup_steps=cfg.training.warmup_steps,
                              min_lr_ratio=cfg.optim.min_lr_ratio, schedule_free=schedule_free,
                              **cfg.optim.schedule_kwargs_dict())
    if record.get("warmup_by") == "optimizer":
        given = ctor.get("warmup_steps")
        if given is not None and given.value not in (0, record["warmup_steps"]):
            raise OptBenchError(f"warmup given twice: optimizer_kwargs warmup_steps={given.value} and warmup_steps="
                                f"{record['warmup_steps']}. Keep one.")
        ctor["warmup_steps"] = Sourced(record["warmup_steps"], "warmup_steps (the schedule's warmup, done by the "
                                                               "schedule-free optimizer itself)")
    deepspeed = bool(getattr(cfg.training, "deepspeed", None)) \
        or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
    if record["name"] == "one_cycle" and deepspeed:
        raise OptBenchError("schedule 'one_cycle' has no transformers lr_scheduler_type, which DeepSpeed rebuilds the "
                            "schedule from: use gpt3_cosine, wsd, constant_with_warmup or constant with DeepSpeed.")
    return record


def _hash_files(paths: list[str], h: Any) -> None:
    for path in paths:
        with open(path, "rb") as fh:
            h.update(hashlib.file_digest(fh, "sha256").digest())


def data_plan(cfg: RunConfig) -> DataPlan:
    """The data's source and content fingerprint (see :class:`DataPlan`). SHA-256 reads 1-2 GB/s here
    (benchmarks/bench_cache_verify.py), so a corpus of many GB adds seconds to a run's start: the price of a resume
    that cannot continue on other text."""
    from hf_optbench.data.sources import THAI_SAMPLE_FILE, resolve_local_files
    from hf_optbench.data.tokenizers import resolve_tokenizer_path

    d = cfg.data
    h = hashlib.sha256()
    if d.data_source == "synthetic":
        return DataPlan("synthetic", "synthetic", h.hexdigest(), 0)
    if d.data_source == "hub":
        h.update(json.dumps([d.dataset_name, d.dataset_config, d.dataset_split]).encode())
        kind, files = "hub", []
    else:
        files = [str(THAI_SAMPLE_FILE)] if d.data_source == "thai_sample" else resolve_local_files(
            d.data_files or [], config=d.dataset_config, split=d.dataset_split).files
        kind = "files"
    _hash_files(files, h)
    tokenizer = resolve_tokenizer_path(d.tokenizer_name)
    if os.path.isdir(tokenizer):  # a local or shipped tokenizer: its files decide the ids (a Hub id: its name)
        _hash_files(sorted(e.path for e in os.scandir(tokenizer) if e.is_file()), h)
    else:
        h.update(tokenizer.encode())
    return DataPlan(d.data_source, kind, h.hexdigest(), len(files))


def _identity(cfg: RunConfig, opt: OptimizerPlan, max_grad_norm: Sourced, schedule: Mapping[str, Any],
              batch: BatchPlan, data: DataPlan, model: ModelPlan, zero_stage: int) -> dict[str, Any]:
    """Every resolved value that changes what is trained, JSON-normalised: the argument dataclasses' own fields
    (less :data:`OWN_KEYS_IGNORED`), :data:`TRAINING_KEYS`, and what the plan resolved (the optimizer's values and
    groups, the schedule, the batch, the data's content)."""
    ident: dict[str, Any] = {}
    for part in (cfg.model, cfg.run, cfg.data, cfg.optim, cfg.bench):
        for f in dataclasses.fields(part):
            if f.name not in OWN_KEYS_IGNORED:
                ident[f.name] = getattr(part, f.name)
    for key in TRAINING_KEYS:
        ident[key] = getattr(cfg.training, key, None)
    ident.update({
        "optimizer": opt.name, "learning_rate": opt.learning_rate.value, "weight_decay": opt.weight_decay.value,
        "max_grad_norm": max_grad_norm.value, "optimizer_constructor": opt.constructor_values(),
        "param_groups": [{"name": g.name, "lr": g.lr.value, "weight_decay": g.weight_decay.value
                          if g.weight_decay is not None else None} for g in opt.groups],
        "schedule_resolved": dict(schedule), "n_positions": model.n_positions, "world_size": batch.world_size,
        "zero_stage": zero_stage, "data_content": f"{data.kind}:{data.fingerprint}",
    })
    return _plain(ident)


def resolve_optimization(cfg: RunConfig) -> tuple[OptimizerPlan, Sourced, dict[str, Any]]:
    """(the optimizer, max_grad_norm, the schedule record) of the plan, from the arguments alone (no file is read
    but a tuned file): what a sweep's validation asks of every run before any starts."""
    from hf_optbench.models import SIZE_CLASS
    from hf_optbench.optim.registry import OPTIMIZERS, cited_defaults
    from hf_optbench.optim.tuned import lookup_tuned

    spec = OPTIMIZERS.get(cfg.optim.optimizer)  # canonical since OptimizerArguments resolved it
    cited, takes_wd = (cited_defaults(spec, SIZE_CLASS[cfg.model.model_size]), True) if spec is not None \
        else _dotted_defaults(cfg)
    tuned_file = cfg.optim.tuned_hparams_file
    # a ladder rung finds its own tuned rate by its budget (every rung is tuned)
    tuned = lookup_tuned(tuned_file, cfg.optim.optimizer, cfg.model.model_size,
                         max_steps=cfg.training.max_steps) if tuned_file else {}
    lr, wd, mgn = (_training_value(cfg, k, tuned, tuned_file, cited)
                   for k in ("learning_rate", "weight_decay", "max_grad_norm"))
    if spec is None and "weight_decay" not in cfg.explicit and "weight_decay" not in cited:
        wd = Sourced(0.0, "the class's default (none given)" if takes_wd else "none: the class takes no weight decay")
    for key, entry in (("learning_rate", lr), ("weight_decay", wd), ("max_grad_norm", mgn)):
        _check_value(key, entry)
    ctor = _constructor(cfg, spec, cited, tuned, tuned_file)
    _resolve_ns_precision(cfg, spec, ctor)
    schedule = _schedule(cfg, spec, ctor)
    layouts = spec.group_layouts({k: v.value for k, v in ctor.items()}) if spec is not None \
        else GPT3_GROUPS if takes_wd else SINGLE_GROUP
    optimizer = OptimizerPlan(cfg.optim.optimizer, spec, lr, wd, MappingProxyType(ctor),
                              _groups(layouts, lr, wd if takes_wd else None, ctor), cfg.optim.embedding_state_32bit)
    return optimizer, mgn, schedule


def resolve_hyperparameters(cfg: RunConfig) -> dict[str, dict[str, Any]]:
    """{key: {"value", "source"}} of the learning rate, weight decay, clipping and every constructor argument, as the
    run's plan resolves them (:func:`resolve_optimization`); nothing is written back into ``cfg``."""
    opt, mgn, _ = resolve_optimization(cfg)
    out = {"learning_rate": opt.learning_rate.entry(), "weight_decay": opt.weight_decay.entry(),
           "max_grad_norm": mgn.entry()}
    return {**out, **{k: v.entry() for k, v in opt.constructor.items()}}


def resolve_plan(cfg: RunConfig) -> RunPlan:
    """The run's plan from its parsed arguments (see the module docstring): each value resolved once, with its
    source, and checked whatever its source; the data's content fingerprinted. Raises OptBenchError (exit 2) before
    any data or model work."""
    from hf_optbench.config.checks import zero_stage
    from hf_optbench.models import SIZE_CLASS

    optimizer, mgn, schedule = resolve_optimization(cfg)
    t = cfg.training
    batch = BatchPlan(t.per_device_train_batch_size, t.gradient_accumulation_steps, t.world_size, cfg.data.block_size)
    model = ModelPlan(cfg.model.model_size, SIZE_CLASS[cfg.model.model_size],
                      cfg.model.n_positions or cfg.data.block_size)
    data = data_plan(cfg)
    stage = zero_stage(t)
    ident = _identity(cfg, optimizer, mgn, schedule, batch, data, model, stage)
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()
    return RunPlan(cfg, optimizer, mgn, MappingProxyType(schedule), batch, data, model, cfg.resume, stage,
                   MappingProxyType(ident), digest)


# ---------------------------------------------------------------------------------------------------- checking
def what_ran(opt_plan: OptimizerPlan, optimizer: Any, model: torch.nn.Module) -> list[dict[str, Any]]:
    """What ran, checked: each param group of the built optimizer (inside any wrapper) against the plan's group
    of its tensors' roles, its learning rate and weight decay, and every planned constructor value a group holds
    under the same name. Returns the groups' records (:func:`~hf_optbench.optim.held.group_record`, with the group's
    name). A difference is a bug in a builder, never a user error: RuntimeError naming the group and key."""
    from hf_optbench.optim.held import group_record, plain
    from hf_optbench.optim.spec import tensor_roles
    from hf_optbench.optim.unwrap import innermost_optimizer

    roles = tensor_roles(model)
    records = []
    for group in innermost_optimizer(optimizer).param_groups:
        held = {roles.get(id(p)) for p in group["params"]}
        planned = next((g for g in opt_plan.groups if held <= set(g.roles)), None)
        rec = group_record(group)
        if planned is None:
            raise RuntimeError(f"{opt_plan.name}: a param group holds tensors of roles {sorted(map(str, held))}, which "
                               f"no planned group ({[g.name for g in opt_plan.groups]}) takes")
        want = {"lr": planned.lr.value}
        if planned.weight_decay is not None:
            want["weight_decay"] = planned.weight_decay.value
        want.update({k: v.value for k, v in opt_plan.constructor.items() if k in rec and k not in want})
        for key, value in want.items():
            if plain(value) != rec.get(key):
                raise RuntimeError(f"{opt_plan.name}: group '{planned.name}' holds {key} {rec.get(key)!r}, the plan "
                                   f"says {value!r}: the optimizer built is not the one planned")
        records.append({"group": planned.name, **rec})
    return records


def plan_record(plan: RunPlan, groups: list[dict[str, Any]], impl: str) -> dict[str, Any]:
    """The record of what ran, rendered from the plan and the checked groups (:func:`what_ran`): ``optimizer``,
    ``optimizer_impl``, ``hyperparameters`` ({key: {"value", "source"}}: the plan's, then what the builder or the
    library set in the groups beyond it), ``param_groups`` (with each group's lr and weight-decay sources) and
    ``schedule``. config.yaml, summary.json, the trackers and the card take their values from it."""
    from hf_optbench.optim.held import CONSTRUCTOR_SOURCE, IMPLEMENTATION, headline

    hyper = plan.hyperparameters()
    for key, value in headline([{k: v for k, v in g.items() if k != "group"} for g in groups]).items():
        if key not in hyper and key not in IMPLEMENTATION:
            hyper[key] = {"value": _plain(value), "source": CONSTRUCTOR_SOURCE}
    by_name = {g.name: g for g in plan.optimizer.groups}
    param_groups = []
    for rec in groups:
        planned = by_name[rec["group"]]
        sources = {"lr": planned.lr.source}
        if planned.weight_decay is not None:
            sources["weight_decay"] = planned.weight_decay.source
        param_groups.append({**_plain(rec), "sources": sources})
    return {"optimizer": plan.optimizer.name, "optimizer_impl": impl, "hyperparameters": hyper,
            "param_groups": param_groups, "schedule": dict(plan.schedule), "plan_hash": plan.plan_hash}
