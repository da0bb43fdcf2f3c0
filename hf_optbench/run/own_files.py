"""A run never replaces files it did not write: an output_dir that is not a run directory but holds files a run
writes (README.md, config.json, config.yaml, the tokenizer's, the weights) is refused before any work.

Why: a run writes its model card to README.md, the model's config to config.json and its own settings to
config.yaml, among others. Pointed at a folder that already holds a user's README.md and configs (a project folder,
a downloaded model), it replaced all three without a word and exited 0. A directory an earlier run wrote is told
apart by what only a run writes (``run_identity.json``, ``summary.json``, ``metrics.jsonl``, ``checkpoint-*``): for
it, the finished/unfinished rules of ``config.parse.check_output_dir`` apply. ``--overwrite_output_dir true`` is
the user saying the files may go.
"""

from __future__ import annotations

from pathlib import Path

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import (
    CONFIG_FILE,
    IDENTITY_FILE,
    METRICS_FILE,
    SEGMENTS_FILE,
    SUMMARY_FILE,
    TRAINER_STATE_FILE,
)

# What a run writes at the top of its output_dir that a user's folder may hold too: the card, the final model
# (trainer.save_model), the tokenizer files saved beside it, the rerunnable config.
RUN_WRITES = ("README.md", CONFIG_FILE, "config.json", "generation_config.json", "model.safetensors",
              "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "tokenizer.model",
              "training_args.bin", TRAINER_STATE_FILE)
# What only a run writes: a directory holding one of them is a run directory (finished, unfinished or killed).
RUN_MARKERS = (IDENTITY_FILE, SUMMARY_FILE, METRICS_FILE, SEGMENTS_FILE)


def is_run_directory(out: Path) -> bool:
    """Whether ``out`` was written by a run (its own bookkeeping files or checkpoints are there)."""
    return any((out / name).exists() for name in RUN_MARKERS) or any(out.glob("checkpoint-*"))


def check_own_files(out: Path, overwrite: bool) -> None:
    """Refuse (exit 2, nothing touched) an ``out`` that is not a run directory but holds files a run would write
    over, naming them, unless ``overwrite`` (``--overwrite_output_dir true``)."""
    if overwrite or not out.is_dir() or is_run_directory(out):
        return
    theirs = [name for name in RUN_WRITES if (out / name).exists()]
    if theirs:
        raise OptBenchError(
            f"output_dir '{out}' is not a run directory but holds {', '.join(theirs)}, which the run would replace "
            "(model card, model config, run config, ...). Choose a new --output_dir, or pass --overwrite_output_dir "
            "true to let the run replace them."
        )
