"""``hf-optbench run --help``: hf_optbench's own keys and the Trainer keys a benchmark sets, grouped, on one screen.

Why not argparse's help: HfArgumentParser prints every TrainingArguments field (859 lines here) and needs
transformers, i.e. torch, imported first (seconds: benchmarks/bench_startup.py measures it). This short help reads our dataclasses' fields and, for the few
Trainer keys shown, their defaults and help strings from transformers' source with ``ast`` (as
``parse._training_fields_fast`` does), so it imports neither. ``--help-all`` lists every option the same way (:func:`full_help`).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import re
import shutil
import textwrap
from pathlib import Path
from typing import Any

from hf_optbench.config.bench_args import BenchArguments
from hf_optbench.config.checks import ADAM_KEYS, REPLACED_TRAINING_KEYS
from hf_optbench.config.data_args import DataArguments
from hf_optbench.config.optim_args import OptimizerArguments
from hf_optbench.config.parse import TRAINING_DEFAULTS, ModelArguments, RunArguments
from hf_optbench.config.trainer_keys import SPELLINGS

# (title, dataclass, keys shown with their help); the group's other keys are listed by name below them.
GROUPS: tuple[tuple[str, Any, tuple[str, ...]], ...] = (
    ("model", ModelArguments, ("model_size",)),
    ("optimizer and schedule", OptimizerArguments,
     ("optimizer", "optimizer_kwargs", "schedule", "tuned_hparams_file")),
    ("data", DataArguments, ("data_source", "data_files", "tokenizer_name", "block_size", "validation_fraction")),
    ("measurement", BenchArguments, ("target_losses", "target_smoothing_steps")),
    ("run directory", RunArguments, ("overwrite_output_dir",)),
)
# The TrainingArguments fields a benchmark user sets; the other ~95 are behind --help-all.
TRAINER_KEYS = ("output_dir", "max_steps", "learning_rate", "weight_decay", "max_grad_norm",
                "per_device_train_batch_size", "gradient_accumulation_steps", "warmup_steps", "eval_steps",
                "save_steps", "seed", "bf16", "report_to", "resume_from_checkpoint")
# What our run puts in place of transformers' default (parse.parse_args, run.plan).
_OUR_DEFAULTS = {"output_dir": "runs/<optimizer>_<size>_s<seed>", "learning_rate": "cited",
                 "weight_decay": "cited", "max_grad_norm": "cited"}
_OUR_HELP = {
    "learning_rate": "Peak learning rate. Unset: the optimizer's cited default for the size (`hf-optbench "
                     "optimizers`), or tuned_hparams_file's.",
    "weight_decay": "Decoupled weight decay (on >=2-D tensors only). Unset: the optimizer's cited default.",
    "max_grad_norm": "Gradient clipping norm (0 = off). Unset: the optimizer's cited default.",
    "output_dir": "The run directory (config.yaml, metrics.jsonl, summary.json, checkpoints).",
    "report_to": "Trackers: tensorboard, wandb (a list), all or none.",
    "max_steps": "Optimizer steps: the run's budget.",
    "gradient_accumulation_steps": "Micro-batches per optimizer step.",
    "warmup_steps": "Warmup steps; a value below 1 is a fraction of max_steps.",
    "eval_steps": "Optimizer steps between evaluations (a recipe setting its own eval_strategy: logging_steps).",
    "save_steps": "Optimizer steps between checkpoints.",
    "resume_from_checkpoint": "true (the newest), a checkpoint path, or force (unstamped).",
}
# One line for the keys whose first sentence is a paragraph; the whole text is in --help-all.
_SHORT_HELP = {
    "optimizer": "Registry name (`hf-optbench optimizers` lists them) or a dotted path (torch.optim.RAdam).",
    "schedule": "gpt3_cosine, wsd, one_cycle, constant_with_warmup, constant or none.",
    "tuned_hparams_file": "The file `hf-optbench tune` writes: its values replace the cited defaults.",
    "data_source": "thai_sample (bundled), hub, local (data_files) or synthetic.",
    "data_files": "data_source=local: files, globs or a directory (txt, jsonl, json.gz, parquet).",
    "tokenizer_name": "Hub id, local directory or builtin:<name> (`hf-optbench tokenizer list`).",
    "block_size": "Tokens per training example (documents packed, EOS between them).",
    "validation_fraction": "Fraction of documents held out for evaluation.",
    "target_losses": "Loss levels to time: steps, tokens and seconds until the smoothed loss reaches each.",
}
KEY_WIDTH = 28


def _first_sentence(text: str) -> str:
    text = " ".join(str(text).split())
    end = re.search(r"(?<!e\.g)(?<!i\.e)\. ", text)
    return text if end is None else text[: end.start() + 1]


def _fmt_default(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return " ".join(map(str, value)) or "[]"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _own_field(f: dataclasses.Field) -> tuple[Any, str]:
    if f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        default = f.default_factory()  # type: ignore[misc]
    else:
        default = None
    return default, f.metadata.get("help", "")


def training_fields_help(names: tuple[str, ...] | None = None) -> dict[str, tuple[Any, str]]:
    """{name: (default, help)} of TrainingArguments fields (``names``, or all of them in the class's order), read from
    transformers' source without importing it."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(next(iter(spec.submodule_search_locations))) / "training_args.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainingArguments")
    out: dict[str, tuple[Any, str]] = {}
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and (names is None or stmt.target.id in names)):
            continue
        if not isinstance(stmt.value, ast.Call):  # a plain `name: type = value` field
            out[stmt.target.id] = (_literal(stmt.value), "")
            continue
        kw = {k.arg: k.value for k in stmt.value.keywords}
        default = _literal(kw.get("default"))
        try:
            help_ = ast.literal_eval(kw["metadata"]).get("help", "") if "metadata" in kw else ""
        except ValueError:
            help_ = ""
        out[stmt.target.id] = (default, help_)
    return out


def _literal(node: ast.expr | None) -> Any:
    """A field's default as written in the source: its value when it is a literal, else its text (a call)."""
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def _lines(name: str, default: Any, help_: str, width: int) -> list[str]:
    """One key: its name, then a short help and its default, wrapped at word boundaries under the help column
    (nothing is cut)."""
    text = _SHORT_HELP.get(name) or _first_sentence(help_)
    shown = _fmt_default(default)
    if shown not in ("-", "[]", "{}"):
        text += f" [{shown}]"
    head = f"  --{name.ljust(KEY_WIDTH)} "
    return textwrap.wrap(text, width=max(width, len(head) + 30), initial_indent=head,
                         subsequent_indent=" " * len(head), break_long_words=False, break_on_hyphens=False)


def _wrapped(label: str, names: list[str], width: int) -> list[str]:
    text = f"{label} " + ", ".join(f"--{n}" for n in names)
    return textwrap.wrap(text, width=width, initial_indent="  ", subsequent_indent="        ")


def short_help(prog: str = "hf-optbench run", width: int | None = None) -> str:
    """The one-screen help (under 80 lines): usage, each group's main keys with default and help, the rest of its
    keys by name, the Trainer keys a benchmark sets, and what hf_optbench refuses."""
    width = width or min(100, max(80, shutil.get_terminal_size((100, 24)).columns))  # 100 columns at most
    intro = ("One benchmark run. A recipe is a flat YAML of these keys; --key value beats the recipe, which beats "
             "hf_optbench's defaults, then transformers'. `hf-optbench validate RECIPE` checks one; --help-all lists "
             "every option.")
    lines = [f"usage: {prog} [RECIPE.yaml] [--key value ...] [-h | --help-all]", ""]
    lines += textwrap.wrap(intro, width=width)
    for title, cls, shown in GROUPS:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        lines += ["", f"{title} ({cls.__name__}):"]
        lines += [line for name in shown for line in _lines(name, *_own_field(fields[name]), width)]
        rest = [n for n in fields if n not in shown]
        if rest:
            lines += _wrapped("also:", rest, width)
    trainer = training_fields_help(TRAINER_KEYS)
    lines += ["", "TrainingArguments (the keys a benchmark sets; --help-all for all of them):"]
    for name in TRAINER_KEYS:
        default, help_ = trainer.get(name, (None, ""))
        default = _OUR_DEFAULTS.get(name, TRAINING_DEFAULTS.get(name, default))
        lines += _lines(name, default, _OUR_HELP.get(name, help_), width)
    lines += _wrapped("AdamW family only (adamw*):", sorted(ADAM_KEYS), width)
    lines += textwrap.wrap("as in TRL recipes: " + ", ".join(f"--{k} (= {v})" for k, v in SPELLINGS.items())
                           + "; transformers' optimizer and schedule names; both spellings of one setting: an error",
                           width=width, initial_indent="  ", subsequent_indent="        ")
    lines += _wrapped("refused (hf_optbench replaces them):", list(REPLACED_TRAINING_KEYS) + ["hub_token"], width)
    return "\n".join(lines)


def _full_entry(name: str, default: Any, help_: str, width: int) -> list[str]:
    """One key of the full list: ``--name [default]`` on its line, its whole help wrapped below it."""
    shown = _fmt_default(default)
    head = f"  --{name}" + ("" if shown in ("-", "[]", "{}") else f"  [default: {shown}]")
    text = " ".join(str(help_).split())
    body = textwrap.wrap(text, width=width, initial_indent=" " * 6, subsequent_indent=" " * 6,
                         break_long_words=True, break_on_hyphens=False) if text else []
    return textwrap.wrap(head, width=width, subsequent_indent=" " * 6, break_long_words=True) + body


def full_help(prog: str = "hf-optbench run", width: int | None = None) -> str:
    """Every option a run accepts, with its default and whole help: hf_optbench's keys, then every
    TrainingArguments field. Why not argparse's own help: it needs transformers (so torch) imported, seconds before
    the first line, and it prints some help texts as single lines of hundreds of columns; this reads the same
    fields (ours from their dataclasses, transformers' from its source with ``ast``) and wraps them."""
    width = width or min(100, max(80, shutil.get_terminal_size((100, 24)).columns))
    lines = [f"usage: {prog} [RECIPE.yaml] [--key value ...] [-h | --help-all]", ""]
    lines += textwrap.wrap("Every option of a run: a recipe is a flat YAML of these keys; --key value beats the "
                           "recipe, which beats hf_optbench's defaults, then transformers'. A boolean key takes "
                           "true or false.", width=width)
    for title, cls, _shown in GROUPS:
        lines += ["", f"{title} ({cls.__name__}):"]
        for f in dataclasses.fields(cls):
            lines += _full_entry(f.name, *_own_field(f), width)
    lines += ["", "TrainingArguments (transformers; hf_optbench's default where it sets one):"]
    for name, (default, help_) in training_fields_help().items():
        default = _OUR_DEFAULTS.get(name, TRAINING_DEFAULTS.get(name, default))
        lines += _full_entry(name, default, _OUR_HELP.get(name, help_), width)
    lines += ["", *_wrapped("refused (hf_optbench replaces them):", list(REPLACED_TRAINING_KEYS) + ["hub_token"],
                            width)]
    return "\n".join(lines)


def print_run_help(full: bool = False, prog: str = "hf-optbench run") -> int:
    """Print the short help, or with ``full`` every option (:func:`full_help`)."""
    print(full_help(prog) if full else short_help(prog))
    return 0
