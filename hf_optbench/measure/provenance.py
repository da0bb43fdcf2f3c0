"""Where a run's figures come from, and the summary.json fields both of its writers fill.

Two paths write summary.json: ``hf_optbench.run`` from its plan (:mod:`hf_optbench.run.summary`), and the recorder
on the Python API path (a stock ``Trainer`` with ``trainer_optimizer`` or ``optimizers=(opt, sched)``), which has
only the Trainer's objects. Each gathers the facts it knows from its own source into a :class:`RunFacts`;
:func:`settings_summary` and :func:`trained_summary` write the :data:`SUMMARY_KEYS` from them, once for both (the
report, the card and ``push`` read them), and each path adds only the keys of its own. The provenance both record
(the code's git state, the package versions and the device, how the run was launched) lives here, below both paths.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_optbench.machine import slurm_job_id

# Packages whose versions change the figures; None in the record means "not installed".
RECORDED_PACKAGES = ("hf_optbench", "torch", "transformers", "accelerate", "datasets", "tokenizers", "evaluate",
                     "bitsandbytes", "lion-pytorch", "schedulefree", "pytorch-optimizer", "deepspeed", "wandb")
# The keys both writers of summary.json fill (docs/ARCHITECTURE.md "summary.json keys"); a test holds each path to
# them. null is a value here only where the run has none (no plan hash, no recipe outside hf_optbench.run).
SUMMARY_KEYS = ("optimizer", "optimizer_impl", "model_size", "num_params", "num_params_non_embedding", "vocab_size",
                "embedding_rows", "block_size", "micro_batch_size", "gradient_accumulation_steps", "world_size",
                "tokens_per_step", "seed", "learning_rate", "weight_decay", "max_grad_norm", "hyperparameters",
                "param_groups", "hyperparameter_sources", "schedule", "schedule_resolved", "schedule_kwargs",
                "precision", "max_steps", "tokens_per_param", "plan_hash", "resumed_from", "data", "env", "git",
                "recipe", "launch", "status", "error", "steps", "tokens_seen", "final_train_loss", "final_eval_loss",
                "train_runtime_s")
# The source of the clipping on the Python API path: the Trainer clips with its own argument.
CLIPPING_SOURCE = "TrainingArguments max_grad_norm (the Trainer's clipping)"


def precision_name(args: Any) -> str:
    """bf16 / fp16 / fp32 from TrainingArguments' flags."""
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"


def git_state(path: Path | None = None) -> dict[str, Any]:
    """Commit of the code that ran and whether its tree had uncommitted changes (None outside git)."""
    where = path or Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True,
                                timeout=10)
        if commit.returncode != 0:
            return {"commit": None, "dirty": None}
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                                capture_output=True, text=True, timeout=10)
        return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def environment() -> dict[str, Any]:
    """Versions and devices a reader needs to reproduce the figures."""
    from importlib import metadata

    import torch

    versions = {}
    for pkg in RECORDED_PACKAGES:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": versions,
        "torch_cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({platform.processor() or platform.machine()})",
        "device_count": torch.cuda.device_count() if cuda else 1,
        "cpu_threads": torch.get_num_threads(),
        # glibc malloc settings move CPU step times by ~25% (README, benchmark 1), so a run records them
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
        "slurm_job_id": slurm_job_id(),  # the SLURM job the run ran as (a sweep's executor: slurm), else null
    }


# ------------------------------------------------------------------------------------------------ the launch


def _parent_argv() -> list[str]:
    """The command line of the process that started this one (Linux's /proc; [] elsewhere). Why: ``accelerate
    launch`` passes its script neither its own arguments nor its config file's path (only the values, as
    ACCELERATE_* variables), and its process is the parent of every process it starts (the simple launcher's
    subprocess, torchrun's workers)."""
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def _launcher_args(argv: list[str]) -> tuple[str | None, list[str]]:
    """("accelerate launch" | "torchrun" | None, the launcher's own options before the script) from its argv."""
    names = [Path(a).name for a in argv[:3]]
    if "accelerate" in names and "launch" in argv:
        rest = argv[argv.index("launch") + 1:]
        launcher = "accelerate launch"
    elif "torchrun" in names or "torch.distributed.run" in argv:
        rest = argv[next(i for i, a in enumerate(argv) if Path(a).name in ("torchrun", "torch.distributed.run")) + 1:]
        launcher = "torchrun"
    else:
        return None, []
    options: list[str] = []
    for token in rest:
        if token in ("-m", "--module") or token.endswith(".py"):
            break
        options.append(token)
    return launcher, options


def _option(options: list[str], *names: str) -> str | None:
    for i, token in enumerate(options):
        key, eq, value = token.partition("=")
        if key in names:
            return value if eq else (options[i + 1] if i + 1 < len(options) else None)
    return None


def launch_record(world_size: int, precision: str, argv: list[str] | None = None) -> dict[str, Any]:
    """How this process was launched, for a rerun that is the same run: ``processes`` (the world size: tokens per
    step depend on it), ``launcher`` ("accelerate launch", "torchrun" or null for a plain process), the launcher's
    ``options`` as given (``--config_file accelerate_configs/cpu_ddp2.yaml``...), its ``config_file`` and the
    ``mixed_precision`` (accelerate's, else the run's precision). ``argv``: the launcher's command line (default:
    the parent process's)."""
    launcher, options = _launcher_args(_parent_argv() if argv is None else argv)
    mixed = os.environ.get("ACCELERATE_MIXED_PRECISION") or {"fp32": "no"}.get(precision, precision)
    record = {"processes": int(world_size), "launcher": launcher, "options": options,
              "config_file": _option(options, "--config_file", "--config-file"), "mixed_precision": mixed}
    return {**record, "rerun_prefix": launch_prefix(record)}


def launch_prefix(launch: dict[str, Any] | None) -> str | None:
    """The launcher part of a rerun line (``accelerate launch --config_file X``), or None for one plain process
    (``hf-optbench run``). A multi-process run launched another way is rerun by ``accelerate launch
    --num_processes N``. The line itself: :func:`hf_optbench.publish.card.rerun_command`."""
    launch = launch or {}
    processes = int(launch.get("processes") or 1)
    options = [str(o) for o in launch.get("options") or []]
    if launch.get("launcher") == "accelerate launch":
        if processes > 1 and not _option(options, "--config_file", "--config-file", "--num_processes",
                                         "--num-processes"):
            options += ["--num_processes", str(processes)]
        return shlex.join(["accelerate", "launch", *options])
    if launch.get("launcher") == "torchrun":
        return shlex.join(["torchrun", *options])
    if processes > 1:
        return f"accelerate launch --num_processes {processes}"
    return None


# ------------------------------------------------------------------------------------- the Python API's summary


def model_size_name(model: Any) -> str:
    """The GPT-2 size table's name of ``model``'s shape (``tiny``, ``gpt2``...), else what the shape is."""
    from hf_optbench.models import GPT2_SIZES

    config = getattr(model, "config", None)
    shape = {k: getattr(config, k, None) for k in ("n_layer", "n_head", "n_embd")}
    for name, row in GPT2_SIZES.items():
        if row == shape:
            return name
    if all(v is not None for v in shape.values()):
        return f"custom (n_layer {shape['n_layer']}, n_head {shape['n_head']}, n_embd {shape['n_embd']})"
    return f"custom {getattr(config, 'model_type', type(model).__name__)}"


def last_log(log_history: list[dict[str, Any]], key: str) -> float | None:
    """The latest value of ``key`` in the Trainer's log history, or None."""
    for row in reversed(log_history):
        if key in row:
            return row[key]
    return None


def _block_size(tokens_per_step: int | None, args: Any) -> int | None:
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * max(int(args.world_size), 1)
    if not tokens_per_step or tokens_per_step % per_step:
        return None
    return tokens_per_step // per_step


@dataclass(frozen=True)
class RunFacts:
    """What a run's summary.json says of its settings, as each path knows it: ``hf_optbench.run`` from its plan,
    the Python API from the Trainer's arguments and the objects it holds. ``record``: what ran (``optimizer``,
    ``optimizer_impl``, ``hyperparameters`` as {key: {"value", "source"}}, ``param_groups``, ``schedule``: the
    resolved schedule with its ``name``); None where a path has no value (no plan hash, no recipe, an unknown
    block size)."""

    record: dict[str, Any]
    model: Any
    model_size: str
    vocab_size: int | None
    block_size: int | None
    micro_batch_size: int
    gradient_accumulation_steps: int
    world_size: int
    tokens_per_step: int | None
    seed: int
    schedule_kwargs: dict[str, Any]
    precision: str
    max_steps: int | None
    plan_hash: str | None
    resumed_from: dict[str, Any] | None
    data: dict[str, Any] | None
    git: dict[str, Any]
    recipe: str | None


_HEADLINE = ("learning_rate", "weight_decay", "max_grad_norm")


def settings_summary(facts: RunFacts) -> dict[str, Any]:
    """The :data:`SUMMARY_KEYS` a run knows before it trains, from ``facts``: the model's sizes, the batch, the
    optimizer's values with their sources, the schedule, the data budget per non-embedding parameter (Chinchilla's
    and Marin's unit: 20 = "1x Chinchilla"), the provenance and the launch; ``error`` None."""
    from hf_optbench.models import count_parameters

    model, record = facts.model, facts.record
    hp = record["hyperparameters"]
    schedule = dict(record.get("schedule") or {})
    non_embedding = count_parameters(model, exclude_embeddings=True)
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    budget = facts.max_steps and facts.tokens_per_step
    return {
        "optimizer": record["optimizer"], "optimizer_impl": record["optimizer_impl"],
        "model_size": facts.model_size, "num_params": count_parameters(model),
        "num_params_non_embedding": non_embedding, "vocab_size": facts.vocab_size,
        "embedding_rows": getattr(embeddings, "num_embeddings", None), "block_size": facts.block_size,
        "micro_batch_size": facts.micro_batch_size, "gradient_accumulation_steps": facts.gradient_accumulation_steps,
        "world_size": facts.world_size, "tokens_per_step": facts.tokens_per_step, "seed": facts.seed,
        **{key: hp.get(key, {}).get("value") for key in _HEADLINE},
        "hyperparameters": hp, "param_groups": record["param_groups"],
        "hyperparameter_sources": {key: hp[key]["source"] for key in _HEADLINE if key in hp},
        "schedule": schedule.get("name"), "schedule_resolved": schedule, "schedule_kwargs": facts.schedule_kwargs,
        "precision": facts.precision, "max_steps": facts.max_steps,
        "tokens_per_param": facts.max_steps * facts.tokens_per_step / max(non_embedding, 1) if budget else None,
        "plan_hash": facts.plan_hash, "resumed_from": facts.resumed_from, "data": facts.data,
        "env": environment(), "git": facts.git, "recipe": facts.recipe,
        "launch": launch_record(facts.world_size, facts.precision),  # the rerun line: run.output.rerun_line
        "error": None,
    }


def trained_summary(state: Any, tokens_per_step: int | None) -> dict[str, Any]:
    """The :data:`SUMMARY_KEYS` a run knows once it trained, from the Trainer's state: steps and tokens done, the
    last logged train and eval losses."""
    steps = int(state.global_step)
    return {"steps": steps, "tokens_seen": steps * tokens_per_step if tokens_per_step else None,
            "final_train_loss": last_log(state.log_history, "loss"),
            "final_eval_loss": last_log(state.log_history, "eval_loss")}


def trainer_summary(args: Any, state: Any, model: Any, record: dict[str, Any], *, tokens_per_step: int | None,
                    data: dict[str, Any] | None, resumed_step: int | None) -> dict[str, Any]:
    """The :data:`SUMMARY_KEYS` of a Trainer run without a plan, from its arguments, its state at train end, its
    model and ``record`` (:func:`hf_optbench.optim.held.held_record`: what the optimizer and scheduler held);
    ``data``: what the Trainer's data loaders held; ``resumed_step``: the step a resume started from. Its own: the
    clipping's source (the Trainer's argument), the launch's ``via`` and the run time the Trainer logged."""
    hp = {**record["hyperparameters"], "max_grad_norm": {"value": args.max_grad_norm, "source": CLIPPING_SOURCE}}
    schedule = dict(record.get("schedule") or {})
    facts = RunFacts(
        record={**record, "hyperparameters": hp}, model=model, model_size=model_size_name(model),
        vocab_size=getattr(getattr(model, "config", None), "vocab_size", None),
        block_size=_block_size(tokens_per_step, args), micro_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps, world_size=int(args.world_size),
        tokens_per_step=tokens_per_step, seed=args.seed,
        schedule_kwargs={k: v for k, v in schedule.items() if k not in ("name", "class", "shape", "lr_lambda")},
        precision=precision_name(args), max_steps=int(state.max_steps) if state.max_steps else None, plan_hash=None,
        resumed_from={"step": resumed_step} if resumed_step else None, data=data, git=git_state(), recipe=None)
    out = settings_summary(facts)
    out["launch"]["via"] = "transformers.Trainer (Python API)"
    return {**out, **trained_summary(state, tokens_per_step),
            "train_runtime_s": last_log(state.log_history, "train_runtime")}
