"""Recipe YAML + CLI overrides -> argument dataclasses, validated before any model or data work.

Precedence: CLI beats YAML beats hf_optbench's defaults beats transformers' defaults. A recipe is a flat YAML
mapping whose keys are fields of :class:`ModelArguments`, :class:`RunArguments`, ``DataArguments``,
``OptimizerArguments``, ``BenchArguments`` or ``transformers.TrainingArguments``.

Parsing is transformers' ``HfArgumentParser`` (argparse underneath), as TRL's ``TrlParser`` does it: the
recipe's mapping becomes the parser's defaults (each value type-checked with its option's type, lists and mappings
kept as they are: :mod:`hf_optbench.config.recipe_defaults`) and the command line is parsed on top, so a CLI value
beats the recipe's. What is written here by hand is only what HfArgumentParser lacks: an unknown-key check with a
suggestion (before anything heavy is imported), a one-line error instead of a 114-option usage dump, and the
record of which keys the user set (so the optimizer registry's cited defaults fill only the others).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf_optbench.config.argv import attach_negative_values
from hf_optbench.config.bench_args import BenchArguments
from hf_optbench.config.bounds import SYNTHETIC_KEYS, check_run_bounds
from hf_optbench.config.checks import (
    MAX_POSITIONS,
    MAX_VOCAB_PAD,
    RATE_KEYS,
    REPLACED_TRAINING_KEYS,
    RUN_DIR_LONGEST_INSIDE,
    check_adam_arguments,
    check_data_files,
    check_finite,
    check_int_range,
    check_optimizer_values,
    check_positive_ints,
    check_rate,
    check_writable_dir,
)
from hf_optbench.config.data_args import DataArguments
from hf_optbench.config.optim_args import OptimizerArguments
from hf_optbench.config.recipe_defaults import allow_lists, parse_with_defaults, recipe_defaults
from hf_optbench.config.trainer_keys import TrainerKeys, translate
from hf_optbench.errors import OptBenchError, suggest
from hf_optbench.models import check_block_size, size_names
from hf_optbench.rundir import check_no_foreign_files, previous_run
from hf_optbench.yaml_file import load_yaml_mapping


@dataclass
class ModelArguments:
    """Which GPT-2 to build (see models.GPT2_SIZES)."""

    model_size: str = field(
        default="tiny",
        metadata={"help": f"GPT-2 size: {size_names()}."},
    )
    n_positions: int | None = field(
        default=None, metadata={"help": "Position-embedding rows; default: the data's block_size."}
    )
    attn_implementation: str = field(
        default="sdpa", metadata={"help": "sdpa (default), eager, flash_attention_2 (CUDA + flash-attn only)."}
    )
    pad_vocab_to_multiple_of: int = field(
        default=64, metadata={"help": "Round the embedding rows up to a multiple of this (nanoGPT: 50257 -> 50304)."}
    )
    init_from: str | None = field(
        default=None, metadata={"help": "Start from this checkpoint (Hub id or local dir) instead of from scratch."}
    )
    dropout: float = field(default=0.0, metadata={"help": "Residual/embedding/attention dropout (0 for pretraining)."})

    def __post_init__(self) -> None:
        from hf_optbench.models import ATTN_IMPLEMENTATIONS, resolve_size

        self.model_size = resolve_size(self.model_size)
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise OptBenchError(
                f"attn_implementation '{self.attn_implementation}' is not one of {', '.join(ATTN_IMPLEMENTATIONS)}."
            )
        if self.n_positions is not None:
            check_int_range("n_positions", self.n_positions, 1, MAX_POSITIONS,
                            "Leave it unset to use block_size (GPT-2: 1024).")
        check_int_range("pad_vocab_to_multiple_of", self.pad_vocab_to_multiple_of, 1, MAX_VOCAB_PAD,
                        "Use 64 (the default) or 1 for no padding.")
        if not 0.0 <= self.dropout < 1.0:
            raise OptBenchError(f"dropout must be in [0, 1), got {self.dropout}.")


@dataclass
class RunArguments:
    """How the run treats its directory and the code that produced it."""

    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Allow replacing a finished run's results in output_dir."}
    )
    require_clean_git: bool = field(
        default=False,
        metadata={"help": "Refuse to run from a git tree with uncommitted changes (so a result always maps to a "
                          "commit)."},
    )
    write_model_card: bool = field(default=True, metadata={"help": "Write README.md (model card) into output_dir."})
    model_card_license: str | None = field(
        default=None,
        metadata={"help": "The license id the model card states (apache-2.0, mit, ...: the Hub's ids); unset: the "
                          "card states none, the weights' license being the user's to choose."},
    )
    save_final_model: bool = field(
        default=True,
        metadata={"help": "Save the final model and tokenizer into output_dir (from_pretrained(output_dir) loads "
                          "it); false keeps only the checkpoints."},
    )
    skip_memory_check: bool = field(
        default=False,
        metadata={"help": "Build the model even when the memory planner says it cannot fit in the device's memory "
                          "(hf_optbench.run.memory_fit refuses such a run otherwise)."},
    )
    num_processes: int | None = field(
        default=None,
        metadata={"help": "The number of processes the run must have (a run's config.yaml records its own): another "
                          "number stops the run before any work, naming both, since tokens per step depend on it. "
                          "Unset: any."},
    )


# hf_optbench's own defaults for TrainingArguments. A loss log every 10 steps: the recorder reads every step's loss
# and grad norm at each log all the same (measure/step_values.py), while the Trainer's logging and the callbacks' on_log
# would otherwise run every step (~1 ms of CPU time per step of the CPU demo's ~8, a host sync per step on a GPU);
# a divergence then stops a run at most 9 steps after it, its step recorded all the same. The NaN filter would hide
# divergence in the Trainer's own logs (it replaces a NaN loss with the running mean when it is on).
TRAINING_DEFAULTS: dict[str, Any] = {
    "logging_steps": 10,
    "logging_nan_inf_filter": False,
    "report_to": "none",
    "eval_strategy": "steps",
    "eval_steps": 50,  # with our eval_strategy only: a recipe that sets its own gets transformers' rule (parse_args)
    "save_strategy": "steps",  # checkpoints by default: a run cut off by a lost machine or quota resumes
    "save_steps": 100,
    "save_total_limit": 2,
    "hub_private_repo": True,  # pushes are private unless the recipe says otherwise
    "hub_strategy": "end",  # one upload after the run; every_save also uploads each checkpoint (hf_optbench.publish.hub)
    "per_device_train_batch_size": 8,
    "per_device_eval_batch_size": 8,
    "max_steps": 200,
    "warmup_steps": 0.1,
    "disable_tqdm": True,
    "dataloader_drop_last": True,
    # GPT-2 uses every parameter in every forward pass; transformers' default (None -> True without gradient
    # checkpointing) costs DDP an extra graph traversal per step and a warning from torch's reducer on every run.
    "ddp_find_unused_parameters": False,
}


@dataclass(frozen=True)
class ResumeRequest:
    """``resume_from_checkpoint`` parsed once (TrainingArguments keeps it a string, so ``"false"`` is truthy):
    ``mode`` "no", "latest" (the newest complete checkpoint in output_dir) or "path" (``path``, any directory);
    ``force`` resumes a checkpoint that carries no verifiable identity (``force`` or ``force:PATH``)."""

    mode: str = "no"
    path: str | None = None
    force: bool = False

    @property
    def requested(self) -> bool:
        return self.mode != "no"


# HfArgumentParser's string_to_bool spellings, "none" and "" for no, "latest" for the newest checkpoint.
_RESUME_NO = frozenset({"", "false", "no", "f", "n", "0", "none"})
_RESUME_LATEST = frozenset({"true", "yes", "t", "y", "1", "latest"})


def parse_resume(value: Any) -> ResumeRequest:
    """``--resume_from_checkpoint`` (a bool from a recipe, a string from the command line) as a :class:`ResumeRequest`:
    false/no/0/none -> no resume, true/yes/1/latest -> the newest checkpoint, force[:PATH], else a checkpoint path."""
    if value is None or value is False:
        return ResumeRequest()
    if value is True:
        return ResumeRequest("latest")
    text = str(value).strip()
    low = text.lower()
    force = low == "force" or low.startswith("force:")
    if force:
        text = text[len("force:"):].strip() if ":" in low else ""
        low = text.lower()
    if low in _RESUME_NO and not force:
        return ResumeRequest()
    if low in _RESUME_LATEST or (force and not text):
        return ResumeRequest("latest", force=force)
    return ResumeRequest("path", os.path.expanduser(text), force=force)


RECIPE_FIX = ("Pass a YAML file of key: value lines (see recipes/quickstart_cpu.yaml), or leave the recipe out to "
              "run on the defaults.")

_OWN_DATACLASSES = (ModelArguments, RunArguments, DataArguments, OptimizerArguments, BenchArguments)


@dataclass
class RunConfig:
    """Everything one run needs, parsed and validated."""

    model: ModelArguments
    run: RunArguments
    data: DataArguments
    optim: OptimizerArguments
    bench: BenchArguments
    training: Any  # transformers.TrainingArguments
    explicit: set[str] = field(default_factory=set)
    recipe_path: str | None = None
    resume: ResumeRequest = field(default_factory=ResumeRequest)
    trainer_keys: TrainerKeys = field(default_factory=TrainerKeys)  # TrainingArguments' own keys, translated

    def to_dict(self) -> dict[str, Any]:
        """All resolved values, flat, as a recipe would hold them (secrets removed by the writer)."""
        out: dict[str, Any] = {}
        for part in (self.model, self.run, self.data, self.optim, self.bench):
            out.update(dataclasses.asdict(part))
        out.update(self.training.to_dict())
        return out


@functools.cache
def training_annotations() -> dict[str, str]:
    """{field: its annotation as written} of TrainingArguments, without importing transformers (which imports torch,
    ~5 s): read from the installed source with ``ast`` (once a process), so that recipe validation stays under a
    second."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        raise OptBenchError("transformers is not installed: pip install -e . (see the README).")
    path = Path(next(iter(spec.submodule_search_locations))) / "training_args.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "TrainingArguments":
            return {
                stmt.target.id: ast.unparse(stmt.annotation)
                for stmt in node.body
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
            }
    raise OptBenchError(f"could not find TrainingArguments in {path}; is transformers installed correctly?")


def _training_fields_fast() -> set[str]:
    """TrainingArguments' field names (:func:`training_annotations`)."""
    return set(training_annotations())


def known_keys() -> dict[str, str]:
    """Every accepted recipe/CLI key -> the dataclass it belongs to."""
    keys = {f.name: cls.__name__ for cls in _OWN_DATACLASSES for f in dataclasses.fields(cls)}
    for name in _training_fields_fast():
        keys.setdefault(name, "TrainingArguments")
    return keys


def _unknown_key_error(key: str, where: str, known: dict[str, str]) -> OptBenchError:
    return OptBenchError(
        f"unknown key '{key}' in {where}.{suggest(key, known, cutoff=0.6)} Keys are fields of ModelArguments, "
        "DataArguments, OptimizerArguments, BenchArguments, RunArguments or transformers.TrainingArguments "
        "(`hf-optbench run --help` lists them)."
    )


def load_recipe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a recipe YAML into a flat mapping (:func:`~hf_optbench.yaml_file.load_yaml_mapping`: a missing, empty,
    binary or malformed file, a key given twice, an alias or a non-mapping is an OptBenchError)."""
    return load_yaml_mapping(path, "recipe file", RECIPE_FIX)


def _split_argv(argv: list[str]) -> tuple[str | None, list[str]]:
    """(recipe path or None, remaining CLI tokens). The recipe is a leading positional *.yaml/*.yml/*.json."""
    if argv and not argv[0].startswith("-"):
        if not argv[0].endswith((".yaml", ".yml", ".json")):
            raise OptBenchError(
                f"'{argv[0]}' is not a recipe: pass a YAML file first, then --key value overrides."
            )
        return argv[0], list(argv[1:])
    return None, list(argv)


def _cli_keys(tokens: list[str]) -> list[str]:
    keys = []
    for tok in tokens:
        if tok.startswith("--") and len(tok) > 2:
            keys.append(tok[2:].split("=", 1)[0].replace("-", "_"))
    return keys


def to_tokens(mapping: dict[str, Any]) -> list[str]:
    """A YAML mapping as command-line tokens (lists -> nargs, dicts -> JSON strings, None -> key left at default):
    a sweep's per-run overrides on each run's command line. A recipe itself is never re-tokenised: it becomes the
    parser's defaults (:func:`parse_args`)."""
    tokens: list[str] = []
    for key, value in mapping.items():
        if value is None:
            continue
        # --key=value: a value such as -1e-3 would otherwise be read by argparse as an option.
        if isinstance(value, bool):
            tokens.append(f"--{key}={'true' if value else 'false'}")
        elif isinstance(value, dict):
            tokens.append(f"--{key}={json.dumps(value)}")
        elif isinstance(value, (list, tuple)):
            if not value:
                continue
            tokens += [f"--{key}", *[json.dumps(v) if isinstance(v, dict) else str(v) for v in value]]
        else:
            tokens.append(f"--{key}={value}")
    return tokens


def check_keys(recipe: dict[str, Any], cli_tokens: list[str], recipe_path: str | None) -> set[str]:
    """Reject unknown or replaced keys (fast, no torch import). Returns the keys the user set, TrainingArguments'
    own keys as the keys they become (:mod:`hf_optbench.config.trainer_keys`)."""
    return read_keys(recipe, cli_tokens, recipe_path)[2]


def read_keys(recipe: dict[str, Any], cli_tokens: list[str], recipe_path: str | None
              ) -> tuple[dict[str, Any], list[str], set[str], TrainerKeys]:
    """(the recipe, the command-line tokens, the keys the user set, what was translated): TrainingArguments' own
    keys translated (:func:`hf_optbench.config.trainer_keys.translate`), then every key checked as in
    :func:`check_keys`."""
    recipe, cli_tokens, trainer = translate(recipe, cli_tokens, recipe_path)
    known = known_keys()
    explicit: set[str] = set()
    for source, keys in ((f"recipe '{recipe_path}'", list(recipe)), ("the command line", _cli_keys(cli_tokens))):
        for key in keys:
            if key in REPLACED_TRAINING_KEYS:
                raise OptBenchError(
                    f"'{key}' (in {source}) is a TrainingArguments option that hf_optbench replaces: "
                    f"{REPLACED_TRAINING_KEYS[key]}."
                )
            if key == "hub_token":
                raise OptBenchError(
                    f"'hub_token' (in {source}) would be written to disk (Trainer pickles its arguments into every "
                    "checkpoint). Set the HF_TOKEN environment variable or run `hf auth login` instead."
                )
            if key not in known:
                raise _unknown_key_error(key, source, known)
            explicit.add(key)
    return recipe, cli_tokens, explicit, trainer


def value_error(message: str) -> OptBenchError:
    """The one line for argparse's ``message`` about a command-line value (``argument --max_steps/--max-steps:
    invalid int value: 'ten'``): the parser's, and run.preflight's for the values it reads before transformers."""
    return OptBenchError(f"{message}. Fix that value in the recipe or on the command line.")


def _make_parser(**kwargs: Any) -> Any:
    from transformers import HfArgumentParser, TrainingArguments

    class _Parser(HfArgumentParser):
        """argparse prints the whole usage (hundreds of lines) on a bad value; say only what is wrong."""

        def error(self, message: str) -> None:  # type: ignore[override]
            raise value_error(message)

    parser = _Parser((ModelArguments, RunArguments, DataArguments, OptimizerArguments, BenchArguments,
                      TrainingArguments), **kwargs)
    allow_lists(parser)
    return parser


def parse_args(argv: list[str] | None = None, *, recipe: dict[str, Any] | None = None) -> RunConfig:
    """Parse ``[RECIPE.yaml] [--key value ...]`` into a validated :class:`RunConfig`.

    Raises OptBenchError (exit code 2 in the CLI) for: a missing or malformed recipe, an unknown key, a key
    hf_optbench replaces, a value of the wrong type, an unknown optimizer/model size/schedule, a non-positive
    learning rate, a block_size beyond n_positions, or an output_dir holding a finished run.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    recipe_path, cli_tokens = _split_argv(argv)
    cli_tokens = attach_negative_values(cli_tokens)  # --weight_decay -inf reaches the finiteness check
    recipe = recipe if recipe is not None else load_recipe(recipe_path) if recipe_path else {}  # preflight's
    recipe, cli_tokens, explicit, trainer = read_keys(recipe, cli_tokens, recipe_path)

    parser = _make_parser()
    ours = dict(TRAINING_DEFAULTS)
    if "eval_strategy" in explicit and "eval_steps" not in explicit:
        del ours["eval_steps"]  # the user's own strategy gets transformers' rule: eval_steps = logging_steps
    defaults = recipe_defaults(parser, ours, "hf_optbench's defaults")
    defaults.update(recipe_defaults(parser, recipe, f"recipe '{recipe_path}'"))
    try:  # the recipe as defaults, the command line on top (argparse: a parsed value beats a default)
        parts = parse_with_defaults(parser, defaults, cli_tokens)
    except OptBenchError:
        raise
    except (ValueError, TypeError) as exc:  # TrainingArguments.__post_init__ and friends
        raise OptBenchError(f"invalid arguments: {exc}") from exc
    model, run, data, optim, bench, training = parts
    if optim.schedule in ("constant", "none") and "warmup_steps" not in explicit:
        training.warmup_steps = 0  # our default warmup (0.1) belongs to the warmup schedules only
    if "output_dir" not in explicit:
        training.output_dir = str(default_output_dir(optim.optimizer, model.model_size, training.seed))
    if trainer.epochs is not None:  # steps once the training split is known: hf_optbench.run.epochs
        training.num_train_epochs, training.max_steps = trainer.epochs, -1
    cfg = RunConfig(model=model, run=run, data=data, optim=optim, bench=bench, training=training,
                    explicit=explicit, recipe_path=recipe_path, resume=parse_resume(training.resume_from_checkpoint),
                    trainer_keys=trainer)
    _validate(cfg)
    return cfg


def default_output_dir(optimizer: str, model_size: str, seed: int) -> Path:
    """A run's output_dir when neither the recipe nor the command line names one: readable and distinct per
    optimizer, size and seed, instead of transformers' ``trainer_output``. The preflight derives it too, to refuse
    a finished run's directory before torch is imported."""
    return Path("runs") / f"{optimizer}_{model_size}_s{seed}"


def _validate(cfg: RunConfig) -> None:
    """Cross-field checks that need no model or data."""
    from hf_optbench.config.checks import check_run_inputs, zero_stage
    from hf_optbench.optim.registry import OPTIMIZERS, check_zero_compatible
    from hf_optbench.optim.schedules import SCHEDULES

    spec = OPTIMIZERS.get(cfg.optim.optimizer)  # resolved once, by OptimizerArguments (None: a dotted path)
    check_zero_compatible(spec, zero_stage(cfg.training))  # e.g. Muon cannot run on flat partitions
    if cfg.optim.schedule not in SCHEDULES:
        hint = suggest(cfg.optim.schedule, SCHEDULES, cutoff=0.6)
        raise OptBenchError(f"unknown schedule '{cfg.optim.schedule}'.{hint} Choose one of: {', '.join(SCHEDULES)}.")
    if "schedule" in cfg.explicit and cfg.optim.schedule != "none" and spec is not None and spec.schedule_free:
        raise OptBenchError(
            f"optimizer '{cfg.optim.optimizer}' is schedule-free (its warmup is inside the optimizer), but schedule "
            f"'{cfg.optim.schedule}' was set: drop the schedule key or set it to none."
        )
    t = cfg.training
    check_positive_ints(t)
    check_finite((cfg.model, cfg.data, cfg.optim, cfg.bench, t), cfg.explicit,
                 {"optimizer_kwargs": cfg.optim.kwargs(), "schedule_kwargs": cfg.optim.schedule_kwargs_dict()})
    check_optimizer_values(cfg.optim.kwargs())
    check_adam_arguments(cfg.optim, t, cfg.explicit)
    check_data_files(cfg.data.data_files)
    check_run_inputs(cfg)  # seeds, workers, betas length, dotted path, init_from, the tuned file
    for key in RATE_KEYS:
        if key in cfg.explicit:
            check_rate(key, getattr(t, key))
    if cfg.trainer_keys.epochs is None and (t.max_steps is None or t.max_steps <= 0):
        raise OptBenchError(
            f"max_steps must be a positive number of optimizer steps, got {t.max_steps}: the benchmark compares "
            "optimizers at equal steps/tokens, so set it (e.g. --max_steps 200)."
        )
    check_run_bounds({"max_steps": t.max_steps, "logging_steps": t.logging_steps, "block_size": cfg.data.block_size,
                      **{k: getattr(cfg.data, k) for k in ("data_source", "synthetic_num_tokens", *SYNTHETIC_KEYS)}})
    # the model's position table is block_size rows when n_positions is unset: the same ceiling
    check_int_range("block_size", cfg.data.block_size, 2, MAX_POSITIONS, "Use e.g. 128 or the model's n_positions.")
    check_block_size(cfg.data.block_size, cfg.model.n_positions or cfg.data.block_size)
    check_num_processes(cfg.run.num_processes, t.world_size, cfg.recipe_path)
    check_output_dir(cfg)


def check_num_processes(wanted: int | None, have: int, recipe_path: str | None) -> None:
    """A recipe recorded by a run on N processes (its config.yaml's ``num_processes``) is not run on another number
    unawares: tokens per step, and so the run, differ (a 2-process run rerun as one trained on half the tokens per
    step and ended at another loss). The line names both numbers and how to rerun it as it ran."""
    if wanted is None or int(wanted) == int(have):
        return
    rerun = rerun_line_of(recipe_path)
    how = f" Rerun it as it ran: {rerun}" if rerun else f" Launch it on {wanted} processes (accelerate launch)"
    raise OptBenchError(
        f"{f'recipe {recipe_path!r}' if recipe_path else 'the command line'} sets num_processes {wanted} (the run "
        f"it records ran on {wanted} process{'es' if int(wanted) > 1 else ''}), and this run has {have}: tokens per "
        f"step would differ, another run.{how}; or pass --num_processes {have} to run it on {have} as a new run.")


def rerun_line_of(recipe_path: str | None) -> str | None:
    """The rerun line a run's config.yaml holds in its header (``#   accelerate launch ... -m hf_optbench.run``),
    or None."""
    if not recipe_path:
        return None
    try:
        lines = Path(recipe_path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        if not line.startswith("#"):
            break
        if " -m hf_optbench.run " in line or "hf-optbench run " in line:
            return line.lstrip("# ").strip()
    return None


def check_output_dir(cfg: RunConfig) -> None:
    """A writable directory that holds no earlier run's results the run would write over (:func:`hf_optbench.rundir.
    previous_run`: decided from every record a run leaves, not summary.json alone): a finished or a damaged run is
    refused unless ``--overwrite_output_dir``, a damaged one also on a resume (whether it finished cannot be told);
    an unfinished one is resumed only when asked and is never silently restarted. Files no hf_optbench run wrote
    (another tool's checkpoint, a user's README.md) are refused by name first, ``--overwrite_output_dir`` or not
    (:func:`hf_optbench.rundir.check_no_foreign_files`); a resume loads only a stamped checkpoint, unless forced."""
    check_run_dir(Path(cfg.training.output_dir), cfg.resume, cfg.run.overwrite_output_dir)


def check_run_dir(out: Path, resume: ResumeRequest, overwrite: bool) -> None:
    """:func:`check_output_dir` of the directory ``out``, given the run's resume request and
    ``overwrite_output_dir``: what parse_args checks, and run.preflight before transformers is imported."""
    check_writable_dir(out, "output_dir", RUN_DIR_LONGEST_INSIDE)
    if not resume.requested:
        check_no_foreign_files(out)
    if overwrite and not resume.requested:
        return
    previous = previous_run(out)
    ways = "Choose a new --output_dir, or pass --overwrite_output_dir true to replace it."
    if previous.state == "damaged":
        raise OptBenchError(f"output_dir '{out}' holds a damaged run: {previous.why}. Nothing was written. {ways}")
    if resume.requested or overwrite:
        return  # a finished run resumed is a no-op (run.output.finished_run_summary); the checkpoint is checked later
    if previous.state == "finished":
        raise OptBenchError(f"output_dir '{out}' already holds a finished run (status '{previous.status}'). {ways}")
    if previous.state == "unfinished" and previous.checkpoints:
        raise OptBenchError(
            f"output_dir '{out}' holds checkpoints of an unfinished run. Continue it with "
            "--resume_from_checkpoint true, or pass --overwrite_output_dir true to start over."
        )
    if previous.state == "unfinished":
        raise OptBenchError(
            f"output_dir '{out}' holds an earlier run that did not finish ({previous.why}) and kept no checkpoint to "
            "resume from; a new run would replace its records. Choose a new --output_dir, or pass "
            "--overwrite_output_dir true to start over."
        )
