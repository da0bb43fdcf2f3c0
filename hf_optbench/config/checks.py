"""Checks of parsed values that need no model or data, run by ``config.parse.parse_args`` before any work.

Why these exist: TrainingArguments accepts values that fail late or not at all (``per_device_train_batch_size 0``
fails after the first evaluation, ``gradient_accumulation_steps 0`` divides by zero, ``max_grad_norm nan`` turns
clipping off silently, an unwritable ``output_dir`` fails after the data and the model are built), and some of
its fields do nothing once hf_optbench hands ``optimizers=(optimizer, scheduler)`` to the Trainer. Each check
raises OptBenchError naming the key and the fix. Standard library only (recipe validation stays fast).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import TORN_CHECKPOINTS_DIR

# TrainingArguments fields the stock Trainer reads only in create_optimizer / create_scheduler /
# get_optimizer_cls_and_kwargs (transformers 5 trainer.py, trainer_optimizer.py) that hf_optbench neither honours
# nor translates (config.trainer_keys translates optim, lr_scheduler_type, lr_scheduler_kwargs and
# num_train_epochs), plus fields that would change what the benchmark compares: each maps to what to use instead.
# A field listed here is refused, never accepted and then ignored.
REPLACED_TRAINING_KEYS: dict[str, str] = {
    "optim_args": "use 'optimizer_kwargs' instead, a JSON object of constructor arguments",
    "optim_target_modules": "hf_optbench builds the optimizer over all trainable parameters (GaLore/APOLLO-style "
                            "target modules are not supported); remove it",
    "auto_find_batch_size": "the benchmark compares at a fixed batch: set 'per_device_train_batch_size' and "
                            "'gradient_accumulation_steps' (`hf-optbench memory` plans what fits)",
}
# TrainingArguments' Adam fields, honoured for the AdamW-family optimizers (ADAM_KEYS -> constructor argument).
ADAM_KEYS = {"adam_beta1": "betas", "adam_beta2": "betas", "adam_epsilon": "eps"}
# The other optimizer/schedule fields the stock Trainer reads, and what honours them once our optimizer and schedule
# replace its own (tests/config/test_training_args.py checks this list against transformers' source).
HONOURED_TRAINING_KEYS = {
    "learning_rate": "the optimizer's learning rate (run.plan; unset: the cited default)",
    "weight_decay": "the decay of the >=2-D parameter group (optim.spec.param_groups; unset: the cited default)",
    "warmup_steps": "the schedule's warmup (optim.schedules.build_scheduler)",
    "gradient_accumulation_steps": "the Trainer's own loop",
    "max_grad_norm": "the Trainer's own clipping (unset: the cited default)",
}
# The largest position table and vocabulary padding a run accepts (refused at parse time, not after 13-90 s of
# allocating 12-26 GB): GPT-2 learned 1,024 positions (Radford et al. 2019, sec. 2.3) and GPT-3 2,048 (Brown et al.
# 2020, sec. 2.1); 65,536 leaves long-context experiments 32x GPT-3's room. Padding pads to a matmul-friendly multiple
# (nanoGPT: 64, 50257 -> 50304); a multiple past 65,536 only adds rows no token uses.
MAX_POSITIONS = 2**16
MAX_VOCAB_PAD = 2**16


def check_int_range(key: str, value: Any, low: int, high: int, fix: str) -> None:
    """``value`` is an integer in [low, high], else an OptBenchError naming the key, the accepted range and ``fix``."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise OptBenchError(f"{key} must be an integer in [{low:,}, {high:,}], got {value!r}. {fix}")


# TrainingArguments fields that must be integers >= 1 (0 divides by zero or evaluates nothing, late).
POSITIVE_INT_KEYS = ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps")


def adam_family() -> tuple[str, ...]:
    """Registry optimizers that take TrainingArguments' adam_beta1/adam_beta2/adam_epsilon: the AdamW variants
    (torch, 8-bit, paged 8-bit, schedule-free), whose ``betas``/``eps`` mean what Adam's do."""
    from hf_optbench.optim.registry import OPTIMIZERS

    return tuple(n for n, s in OPTIMIZERS.items() if "adamw" in n and {"betas", "eps"} <= set(s.kwargs))


def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return any(_non_finite(v) for v in value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    return False


def check_finite_value(key: str, value: Any) -> None:
    """``value`` (of the key ``key`` the user set) holds no inf or nan: ``max_grad_norm nan`` would turn clipping
    off, ``learning_rate inf`` diverge at step 1."""
    if _non_finite(value):
        raise OptBenchError(f"{key} must be a finite number, got {value!r}. Set a finite --{key}, or drop the key to "
                            "use the default.")


def check_finite(parts: tuple[Any, ...], explicit: set[str], mappings: dict[str, dict[str, Any]]) -> None:
    """Every number the user set (:func:`check_finite_value`) and every number inside ``mappings`` (e.g.
    optimizer_kwargs) is finite."""
    for part in parts:
        for f in dataclasses.fields(part):
            if f.name in explicit:
                check_finite_value(f.name, getattr(part, f.name, None))
    for key, mapping in mappings.items():
        for name, value in mapping.items():
            if _non_finite(value):
                raise OptBenchError(
                    f"{key} '{name}' must hold finite numbers, got {value!r}. Fix {key} (e.g. "
                    f"{{\"betas\": [0.9, 0.95]}}) in the recipe or on the command line."
                )


# TrainingArguments' rates that hf_optbench fills from the optimizer's cited defaults when unset: a value the user
# sets is checked here, since the optimizer's own check fires only once it is built, after the data and the model.
RATE_KEYS = ("learning_rate", "weight_decay", "max_grad_norm")


def check_rate(key: str, value: float) -> None:
    """A rate of :data:`RATE_KEYS` the user set: learning_rate > 0, the others >= 0 (checked after
    :func:`check_finite_value`)."""
    if key == "learning_rate" and not value > 0:
        raise OptBenchError(f"learning_rate must be positive, got {value}. Set e.g. --learning_rate 6e-4.")
    if value < 0:
        raise OptBenchError(f"{key} must be >= 0, got {value}. Set --{key} to 0 or more, or drop the key to use the "
                            "optimizer's cited default.")


def check_optimizer_values(kwargs: dict[str, Any]) -> None:
    """betas in [0, 1), eps >= 0 and ns_steps >= 1, before torch's own check fires after the data and model are
    built (or, for ns_steps 0, never: an update left unorthogonalised)."""
    betas = kwargs.get("betas")
    if betas is not None:
        if not isinstance(betas, (list, tuple)) or not all(isinstance(b, (int, float)) and 0 <= b < 1
                                                           for b in betas):
            raise OptBenchError(
                f"optimizer_kwargs 'betas' must be a list of numbers in [0, 1), got {betas!r}. Use e.g. [0.9, 0.95]."
            )
    eps = kwargs.get("eps")
    if eps is not None:
        values = eps if isinstance(eps, (list, tuple)) else [eps]
        if not all(v is None or (isinstance(v, (int, float)) and v >= 0) for v in values):
            raise OptBenchError(f"optimizer_kwargs 'eps' must be >= 0, got {eps!r}. Use e.g. 1e-8.")
    steps = kwargs.get("ns_steps")  # Muon's Newton-Schulz iterations: 0 would not orthogonalise, no longer Muon
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise OptBenchError(f"optimizer_kwargs 'ns_steps' must be an integer >= 1 (Muon orthogonalises its update "
                            f"with that many Newton-Schulz iterations), got {steps!r}. Use e.g. 5, the cited value.")


def check_positive_ints(training: Any) -> None:
    """Batch sizes and accumulation >= 1; logging/eval/save intervals (steps, or in transformers 5 a fraction of
    the run) > 0 when set; save_total_limit >= 1 when set."""
    for key in POSITIVE_INT_KEYS:
        value = getattr(training, key)
        if not isinstance(value, int) or value < 1:
            raise OptBenchError(f"{key} must be an integer >= 1, got {value!r}. Fix --{key} (e.g. --{key} 8).")
    for key in ("logging_steps", "eval_steps", "save_steps"):
        value = getattr(training, key, None)
        if value is not None and not value > 0:
            raise OptBenchError(f"{key} must be positive, got {value!r}. Fix --{key} (e.g. --{key} 50).")
    limit = getattr(training, "save_total_limit", None)
    if limit is not None and limit < 1:  # transformers keeps every checkpoint for 0 and negative values
        raise OptBenchError(f"save_total_limit must be >= 1 (the checkpoints kept), got {limit}, which transformers "
                            "reads as no limit: every checkpoint would be kept. Leave it unset to keep all, or set "
                            "e.g. --save_total_limit 2.")


def check_adam_arguments(optim: Any, training: Any, explicit: set[str]) -> None:
    """adam_beta1/adam_beta2/adam_epsilon are honoured for the AdamW family only (:func:`adam_constructor`): for any
    other optimizer they would be ignored, so they are refused, naming ``optimizer_kwargs``; they may not set what
    optimizer_kwargs sets too; and their values are Adam's (betas in [0, 1), eps >= 0)."""
    set_keys = sorted(k for k in ADAM_KEYS if k in explicit)
    if not set_keys:
        return
    family = adam_family()
    if optim.optimizer not in family:
        raise OptBenchError(
            f"'{set_keys[0]}' is a TrainingArguments option for Adam, and optimizer '{optim.optimizer}' does not "
            f"take it (only {', '.join(family)} do). Set its constructor arguments with optimizer_kwargs, e.g. "
            "--optimizer_kwargs '{\"betas\": [0.9, 0.99]}' (`hf-optbench optimizers` lists each one's arguments)."
        )
    kwargs = optim.kwargs()
    for key in set_keys:
        if ADAM_KEYS[key] in kwargs:
            raise OptBenchError(
                f"'{key}' and optimizer_kwargs '{ADAM_KEYS[key]}' both set the optimizer's {ADAM_KEYS[key]}: keep "
                "one of them."
            )
    check_optimizer_values(adam_constructor(training, explicit, (0.0, 0.0)))


def adam_constructor(training: Any, explicit: set[str], cited_betas: tuple[float, float]) -> dict[str, Any]:
    """The AdamW-family constructor values adam_beta1/adam_beta2/adam_epsilon set (a beta left unset keeps
    ``cited_betas``' value): ``betas`` and ``eps``, only those the user set. Read by the run's plan, which records
    them with source "user"; nothing is written back into the parsed arguments."""
    out: dict[str, Any] = {}
    if "adam_beta1" in explicit or "adam_beta2" in explicit:
        b1, b2 = cited_betas
        out["betas"] = [training.adam_beta1 if "adam_beta1" in explicit else b1,
                        training.adam_beta2 if "adam_beta2" in explicit else b2]
    if "adam_epsilon" in explicit:
        out["eps"] = training.adam_epsilon
    return out


# The longest path a run creates inside its output_dir: a torn checkpoint set aside under its step and time
# (run.identity.move_torn_checkpoint: checkpoint-N.YYYYmmddTHHMMSS-n), holding the longest file name transformers
# writes into a checkpoint; 12 digits of steps. tests/test_checkpoint_resume.py checks it against a real run's files.
RUN_DIR_LONGEST_INSIDE = f"{TORN_CHECKPOINTS_DIR}/checkpoint-{'9' * 12}.20261126T000000-99/model.safetensors.index.json"
# Where os.pathconf cannot say (another OS, a filesystem that does not answer): Linux's limits.
NAME_MAX_DEFAULT, PATH_MAX_DEFAULT = 255, 4096


def _abbrev(text: str, keep: int = 24) -> str:
    """``text`` cut to its first and last ``keep`` characters: an error line stays one readable line."""
    return text if len(text) <= 2 * keep + 3 else f"{text[:keep]}...{text[-keep:]}"


def _nearest_existing(p: Path) -> Path:
    """The nearest ancestor of ``p`` (or ``p``) that exists; ``Path.exists`` itself raises on a name too long."""
    for candidate in (p, *p.parents):
        try:
            candidate.stat()
            return candidate
        except OSError:
            continue
    return Path(p.anchor or "/")


def _limit(where: Path, name: str, default: int) -> int:
    try:
        value = os.pathconf(where, name)
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows), or the filesystem does not say
        return default
    return value if isinstance(value, int) and value > 0 else default


# Characters that end a line (or a C string): never in a path a run records, prints or writes into a script.
LINE_BREAKS = {"\n": "line break", "\r": "carriage return", "\0": "NUL character"}


def check_no_line_break(path: str | os.PathLike[str], key: str) -> None:
    """Refuse a ``path`` holding a line break (or a carriage return, NUL). Why: a run writes its output_dir into
    config.yaml's rerun comment, the command lines it prints and a SLURM job script; a line break there splits the
    comment (the config.yaml no longer reruns) or the line (a pasted command runs the rest)."""
    text = os.fsdecode(path)
    bad = next((c for c in LINE_BREAKS if c in text), None)
    if bad is not None:
        raise OptBenchError(f"{key} holds a {LINE_BREAKS[bad]} ({_abbrev(repr(text))}), which would split the "
                            "lines it is written into (config.yaml's rerun line, printed commands, a job script). "
                            f"Choose another {key}, without one.")


def check_path_fits(path: str | os.PathLike[str], key: str, inside: str = "") -> None:
    """Every name of ``path`` fits the filesystem's NAME_MAX and ``path`` joined with ``inside`` (the longest path
    the tool will create below it) fits its PATH_MAX, both in bytes (a Thai letter is 3 bytes of UTF-8), read with
    ``os.pathconf`` on the nearest existing ancestor (where the new names will be made). Why: a 300-character
    output_dir ended in an OSError traceback ("File name too long") after the recipe was parsed; a path that fits
    but leaves no room for a checkpoint's files would fail at the first save. A line break is refused first
    (:func:`check_no_line_break`)."""
    check_no_line_break(path, key)
    p = Path(os.path.abspath(os.path.expanduser(str(path))))
    ancestor = _nearest_existing(p)
    name_max = _limit(ancestor, "PC_NAME_MAX", NAME_MAX_DEFAULT)
    for part in p.parts[1:]:
        if len(os.fsencode(part)) > name_max:
            raise OptBenchError(
                f"{key} '{_abbrev(str(path))}' has a name of {len(os.fsencode(part))} bytes ('{_abbrev(part, 12)}'), "
                f"longer than the {name_max} bytes the filesystem of '{_abbrev(str(ancestor))}' allows for one name "
                f"(NAME_MAX). Choose a shorter {key}.")
    path_max = _limit(ancestor, "PC_PATH_MAX", PATH_MAX_DEFAULT)
    longest = os.path.join(p, inside) if inside else str(p)
    if len(os.fsencode(longest)) >= path_max:  # PATH_MAX counts the terminating NUL
        n = len(os.fsencode(str(p)))
        within = "" if n >= path_max else \
            f" and the longest path created inside it makes {len(os.fsencode(longest))}, which is"
        raise OptBenchError(
            f"{key} '{_abbrev(str(path))}' is {n} bytes long{within or ','} past the {path_max - 1} bytes the filesystem "
            f"of '{_abbrev(str(ancestor))}' allows for a path (PATH_MAX). Choose a shorter {key}.")


def check_writable_dir(path: str | os.PathLike[str], key: str, inside: str = "") -> None:
    """``path`` is a directory we can write, or can be created: its names fit the filesystem
    (:func:`check_path_fits`, with ``inside`` the longest path to be created below it), it is not a file, its
    nearest existing ancestor is a directory, and that ancestor is writable (``os.access`` also says no on a
    read-only filesystem). Nothing is created: a bad path fails here, before the data and the model are built, and
    leaves no trace."""
    check_path_fits(path, key, inside)
    p = Path(os.path.abspath(os.path.expanduser(str(path))))
    if p.exists() and not p.is_dir():
        raise OptBenchError(f"{key} '{path}' is a file, not a directory. Choose another {key} (a new or existing "
                            "directory).")
    ancestor = p
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OptBenchError(f"{key} '{path}' cannot be created: '{ancestor}' is a file. Choose another {key}.")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OptBenchError(
            f"{key} '{path}' is not writable ('{ancestor}' is read-only or not yours). Choose a directory you "
            f"can write for {key}."
        )


def check_data_files(data_files: list[str] | None) -> None:
    """Each data_files entry (file, directory or glob) matches something, checked before any reading. The data
    layer expands the same entries (data.sources.expand_data_files); this is the cheap existence check only."""
    import glob

    for entry in data_files or []:
        path = os.path.expanduser(str(entry))
        found = glob.glob(path, recursive=True) if glob.has_magic(path) else os.path.exists(path)
        if not found:
            raise OptBenchError(f"data_files entry not found: '{entry}'. Give an existing file, glob or directory.")


def zero_stage(training: Any) -> int:
    """The DeepSpeed ZeRO stage a run will use: from ``--deepspeed`` (a JSON file or dict) or, under
    ``accelerate launch`` with a DeepSpeed config, from accelerate's environment; 0 without DeepSpeed."""
    ds = getattr(training, "deepspeed", None)
    if isinstance(ds, str) and os.path.isfile(ds):
        try:
            ds = json.loads(Path(ds).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise OptBenchError(f"deepspeed config '{ds}' is not readable JSON ({exc}). Fix the file.") from None
    if isinstance(ds, dict):
        return int((ds.get("zero_optimization") or {}).get("stage", 0) or 0)
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        return int(os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2"))  # accelerate's own default stage
    return 0


# numpy's and torch's seeding take 0 <= seed < 2**32 (transformers.set_seed fails on anything else, after the data).
SEED_RANGE = (0, 2**32 - 1)
# What a local init_from directory must hold for from_pretrained (a config and some weights).
INIT_FROM_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                     "pytorch_model.bin.index.json")


def check_run_inputs(cfg: Any) -> None:  # a RunConfig (config.parse imports this module)
    """The values that failed only after the data and the model were built (or silently did nothing): the seeds,
    dataloader workers, a registry optimizer's betas length, a dotted-path optimizer that does not import, a local
    init_from directory without a model, a local tokenizer directory that asks for custom code, and a tuned-values file that is not one (unreadable, unknown optimizer or
    size, non-numeric rate). report_to is checked where it is parsed (config.recipe_defaults.report_to_list)."""
    t = cfg.training
    for key in ("seed", "data_seed"):
        value = getattr(t, key, None)
        if value is not None and not (isinstance(value, int) and SEED_RANGE[0] <= value <= SEED_RANGE[1]):
            raise OptBenchError(f"{key} must be an integer in [0, 2**32 - 1] (numpy's and torch's seeding range), "
                                f"got {value!r}. Fix --{key} (e.g. --{key} 0).")
    workers = getattr(t, "dataloader_num_workers", 0)
    if not isinstance(workers, int) or workers < 0:
        raise OptBenchError(f"dataloader_num_workers must be an integer >= 0, got {workers!r}. Fix "
                            "--dataloader_num_workers (0 loads in the main process).")
    check_betas_length(cfg.optim.optimizer, cfg.optim.kwargs())
    check_dotted_optimizer(cfg.optim.optimizer)
    if cfg.model.init_from:
        check_init_from(str(cfg.model.init_from))
    tokenizer = Path(os.path.expanduser(str(cfg.data.tokenizer_name or "")))
    if cfg.data.needs_tokenizer and cfg.data.tokenizer_name and tokenizer.is_dir():
        check_tokenizer_dir(tokenizer)
    if cfg.optim.tuned_hparams_file and os.path.isfile(cfg.optim.tuned_hparams_file):
        check_tuned_file(cfg.optim.tuned_hparams_file)


def check_betas_length(optimizer: str, kwargs: dict[str, Any]) -> None:
    """A registry optimizer's betas (and Muon's adamw_betas) are two numbers: torch indexes betas[1] only at the
    first step. Dotted-path classes may take another length and are left to their constructor."""
    from hf_optbench.optim.dotted import is_dotted_path

    if is_dotted_path(optimizer):
        return
    for key in ("betas", "adamw_betas"):
        betas = kwargs.get(key)
        if isinstance(betas, (list, tuple)) and len(betas) != 2:
            raise OptBenchError(f"optimizer_kwargs '{key}' must hold two numbers (beta1, beta2), got {list(betas)}. "
                                f"Use e.g. {{\"{key}\": [0.9, 0.95]}}.")


def check_init_from(init_from: str) -> None:
    """A local init_from (an existing path, or one written as a path) is a directory holding config.json and model
    weights; a Hub id ("org/name") is left to from_pretrained, which needs the network."""
    path = Path(os.path.expanduser(init_from))
    looks_local = path.exists() or init_from.startswith(("/", ".", "~")) or init_from.count("/") > 1
    if not looks_local:
        return
    hint = "Pass a directory holding config.json and model.safetensors (a run's checkpoint-N), or a Hub model id."
    if not path.is_dir():
        raise OptBenchError(f"init_from '{init_from}' is not a directory. {hint}")
    if not (path / "config.json").is_file() or not any((path / w).is_file() for w in INIT_FROM_WEIGHTS):
        raise OptBenchError(f"init_from '{init_from}' holds no model (config.json and model.safetensors). {hint}")
    check_init_from_config(path / "config.json", init_from)
    if not any((path / w).is_file() for w in INIT_FROM_WEIGHTS if "safetensors" in w):  # else safetensors are read
        for weights in sorted(path.glob("pytorch_model*.bin")):
            refused = refused_pickle(weights)
            if refused:
                raise OptBenchError(
                    f"init_from '{init_from}': {weights.name} is a pickle that torch's safe loader refuses "
                    f"({refused}): loading it could run code, so it is never loaded. Start from a checkpoint saved "
                    "as model.safetensors, or convert this one from a copy you trust.")


def check_init_from_config(config: Path, init_from: str) -> None:
    """An init_from config.json is a JSON object (of at most :data:`~hf_optbench.yaml_file.MAX_SETTINGS_BYTES`)
    that asks for no custom code. Why: a config with ``auto_map`` names modelling code of its own; hf_optbench never
    runs it (``trust_remote_code`` stays off) and transformers then builds the stock class of its ``model_type``
    without a word, so the user would train another model than the one the checkpoint was made with."""
    data = _settings_json(config, f"init_from '{init_from}'", "model config")
    if data.get("auto_map"):
        raise OptBenchError(
            f"init_from '{init_from}': {config.name} asks for custom modelling code (auto_map: "
            f"{_auto_map_words(data['auto_map'])}), which hf_optbench never runs, so it would load as the stock "
            f"'{data.get('model_type')}' class instead. Remove auto_map from config.json to load it as that class, "
            "or start from a checkpoint without custom code.")


# The files of a tokenizer directory through which transformers' AutoTokenizer reaches custom code (auto_map).
TOKENIZER_CODE_FILES = ("tokenizer_config.json", "config.json")


def check_tokenizer_dir(directory: Path, key: str = "tokenizer_name") -> None:
    """A local tokenizer directory whose tokenizer_config.json or config.json names code of its own (``auto_map``) is
    refused naming the file. Why: loading it would run that directory's Python (transformers asks "[y/N]" on a
    terminal and runs it on "y"); hf_optbench never runs custom code, and a tokenizer's class decides token ids, so
    the stock class in its place would not be the tokenizer the user named."""
    for name in TOKENIZER_CODE_FILES:
        path = directory / name
        if not path.is_file():
            continue
        data = _settings_json(path, f"{key} '{directory}'", "tokenizer setting")
        if data.get("auto_map"):
            raise OptBenchError(
                f"{key} '{directory}': {path} asks for custom tokenizer code (auto_map: "
                f"{_auto_map_words(data['auto_map'])}), which hf_optbench never runs. Use a tokenizer saved with "
                "a stock class (tokenizer.json, e.g. from save_pretrained of a PreTrainedTokenizerFast), a shipped "
                "builtin:<name>, or `hf-optbench tokenizer train`.")


def _auto_map_words(auto_map: Any) -> str:
    """auto_map as "class -> module.Class, ..." cut to 200 characters (a hostile file may hold anything)."""
    if isinstance(auto_map, dict):
        return ", ".join(f"{k} -> {v}" for k, v in auto_map.items())[:200]
    return str(auto_map)[:200]


def _settings_json(path: Path, what: str, kind: str) -> dict[str, Any]:
    """The JSON object in ``path`` (at most :data:`~hf_optbench.yaml_file.MAX_SETTINGS_BYTES`), or an OptBenchError
    naming ``what`` and the file."""
    from hf_optbench.yaml_file import MAX_SETTINGS_BYTES, loads_json_bounded

    try:
        if path.stat().st_size > MAX_SETTINGS_BYTES:
            raise ValueError(f"{path.stat().st_size:,} bytes, more than a {kind}'s {MAX_SETTINGS_BYTES:,}")
        data = loads_json_bounded(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise OptBenchError(f"{what}: {path.name} is not a readable {kind} "
                            f"({type(exc).__name__}: {str(exc)[:120]}). Fix or replace it.") from None
    if not isinstance(data, dict):
        raise OptBenchError(f"{what}: {path.name} does not hold a JSON object. Fix or replace it.")
    return data


def refused_pickle(path: Path) -> str | None:
    """Why torch's safe loader (``weights_only``) refuses the pickle at ``path`` (the global it would import), or None
    when it loads it (memory-mapped onto the meta device: no tensor is read) or the file is not one it can judge
    (damaged: transformers says so when it loads it)."""
    import pickle
    import zipfile

    import torch

    try:
        torch.load(path, map_location="meta", weights_only=True, mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        why = next((line for line in lines if "GLOBAL" in line or "Unsupported" in line), lines[0] if lines else "")
        return why.rstrip(".") or "refused"
    except Exception:  # noqa: BLE001 - a damaged or foreign file: not a refused pickle
        return None
    return None


def check_tuned_file(path: str) -> None:
    """A tuned-values file is UTF-8 YAML/JSON mapping registry optimizers to model sizes to values, with a finite
    learning rate > 0 and weight decay and max_grad_norm >= 0 (what the command line accepts): a typo ('tinyy', 'adamq') would otherwise be skipped silently and the
    run fall back to the cited default, and a bad value fail only for the optimizer that reads it."""
    from hf_optbench.models import resolve_size
    from hf_optbench.optim.registry import resolve_optimizer_name
    from hf_optbench.optim.tuned import tuned_number_ok
    from hf_optbench.yaml_file import load_yaml_mapping

    fix = "Fix the file, or write it again with `hf-optbench tune`."
    data = load_yaml_mapping(path, "tuned_hparams_file", f"It must map optimizer -> model_size -> values. {fix}")
    for opt, sizes in data.items():
        try:
            resolve_optimizer_name(str(opt))
        except OptBenchError as exc:
            raise OptBenchError(f"tuned_hparams_file '{path}': {exc}") from None
        if not isinstance(sizes, dict):
            raise OptBenchError(f"tuned_hparams_file '{path}': entry '{opt}' must map model_size -> values. {fix}")
        for size, values in sizes.items():
            try:
                resolve_size(str(size))
            except OptBenchError as exc:
                raise OptBenchError(f"tuned_hparams_file '{path}' ({opt}): {exc}") from None
            if not isinstance(values, dict):
                raise OptBenchError(f"tuned_hparams_file '{path}': {opt}/{size} must be a mapping. {fix}")
            for key in ("learning_rate", "weight_decay", "max_grad_norm"):
                if key in values and not tuned_number_ok(key, values[key]):
                    raise OptBenchError(f"tuned_hparams_file '{path}': {opt}/{size} {key} is {values[key]!r}, not a "
                                        f"finite number {'> 0' if key == 'learning_rate' else '>= 0'}. {fix}")


def check_dotted_optimizer(optimizer: str) -> None:
    """A dotted-path optimizer names an importable torch.optim.Optimizer subclass: the registry only checks that
    its top-level package is installed, so 'torch.optim.AdamWW' failed when the optimizer was built, after the data
    and the model (and in a sweep, at launch)."""
    from hf_optbench.optim.dotted import import_module_trusted, is_dotted_path

    if not is_dotted_path(optimizer):
        return
    module_name, _, cls_name = optimizer.rpartition(".")
    fix = ("Check the dotted path (e.g. torch.optim.RAdam); a module of your own must be installed or on PYTHONPATH "
           "(the working directory is not searched).")
    try:
        cls = getattr(import_module_trusted(module_name), cls_name)
    except (ImportError, AttributeError) as exc:
        raise OptBenchError(f"optimizer '{optimizer}' could not be imported ({exc}). {fix}") from None
    import torch

    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise OptBenchError(f"optimizer '{optimizer}' is not a torch.optim.Optimizer subclass. {fix}")
