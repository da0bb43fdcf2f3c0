"""What a run does to its output_dir before training: pick the checkpoint to resume from, clear a previous run
when asked to overwrite it, and write the resolved ``config.yaml``.

Checks that need no work (a finished run is not overwritten by accident, an unfinished one is not silently
restarted) are in :func:`hf_optbench.config.parse.check_output_dir`, before anything is built.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from hf_optbench.config.parse import RunConfig
from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import (
    CONFIG_FILE,
    FINISHED_STATUSES,
    METRICS_FILE,
    SEGMENTS_FILE,
    SUMMARY_FILE,
    TORN_CHECKPOINTS_DIR,
    read_summary,
)

RUN_FILES = ("summary.json", "metrics.jsonl", "config.yaml", "trainer_state.json", "README.md", SEGMENTS_FILE)


def _write_config(cfg: RunConfig, out: Path, hparams: dict[str, Any]) -> None:
    """config.yaml: every resolved value and where each hyperparameter came from, secrets removed."""
    import yaml

    from hf_optbench.publish.redact import scrub_secrets

    resolved = scrub_secrets(cfg.to_dict())
    resolved["_hyperparameter_sources"] = {k: v["source"] for k, v in hparams.items()}
    (out / "config.yaml").write_text(
        "# Resolved configuration of this run (recipe + CLI + defaults); secrets removed.\n"
        + yaml.safe_dump(json.loads(json.dumps(resolved, default=str)), sort_keys=True),
        encoding="utf-8",
    )


def resolve_resume_checkpoint(out: Path, move_incomplete: bool = True) -> str:
    """``--resume_from_checkpoint true`` -> the newest *complete* checkpoint in ``out``.

    transformers' get_last_checkpoint takes the highest-numbered folder even when a SIGKILL tore it mid-save
    (resume then fails on a truncated safetensors header). A checkpoint is complete once trainer_state.json, written
    last, is there; incomplete ones are moved aside (:func:`move_torn_checkpoint`), never deleted.
    """
    ckpts = sorted((p for p in out.glob("checkpoint-*") if re.fullmatch(r"checkpoint-\d+", p.name)),
                   key=lambda p: int(p.name.split("-")[1]))
    complete = [p for p in ckpts if (p / "trainer_state.json").is_file()]
    if not complete:
        raise OptBenchError(
            f"--resume_from_checkpoint true but '{out}' holds no complete checkpoint-* folder: start without it "
            "(with --overwrite_output_dir true if the folder has other results), or pass a checkpoint path."
        )
    if move_incomplete:
        legacy = sorted(out.glob("checkpoint-*.incomplete"))  # how earlier versions set torn ones aside
        for p in [*(p for p in ckpts if p not in complete), *legacy]:
            move_torn_checkpoint(p)
    return str(complete[-1])


def move_torn_checkpoint(ckpt: Path) -> Path:
    """Move a torn checkpoint to ``output_dir/torn_checkpoints/checkpoint-N.<time>`` and return where it went.

    Out of the ``checkpoint-*`` namespace, because transformers' save_total_limit rotation globs ``checkpoint-*``
    and reads any name with a number in it as a checkpoint (a ``checkpoint-8.incomplete`` beside it was counted
    and deleted); under a name of its own, because the same step can be torn twice (a kill mid-save, a resume, a
    second kill at the same save).
    """
    torn_dir = ckpt.parent / TORN_CHECKPOINTS_DIR
    torn_dir.mkdir(exist_ok=True)
    stem = f"{ckpt.name}.{time.strftime('%Y%m%dT%H%M%S')}"
    target, n = torn_dir / stem, 1
    while target.exists():
        target, n = torn_dir / f"{stem}-{n}", n + 1
    ckpt.rename(target)
    return target


def _clear_previous(out: Path) -> None:
    """--overwrite_output_dir: remove what a previous run wrote (only hf_optbench/Trainer outputs)."""
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for child in out.glob("checkpoint-*"):
        shutil.rmtree(child, ignore_errors=True)


def resolve_resume(cfg: RunConfig, out: Path) -> str | bool | None:
    """``resume_from_checkpoint`` as Trainer takes it: "true"/"false" strings become booleans, and True becomes
    the newest complete checkpoint in ``out``."""
    args = cfg.training
    resume = args.resume_from_checkpoint
    if isinstance(resume, str) and resume.lower() in ("true", "false"):
        resume = resume.lower() == "true"
    if resume is True:
        resume = resolve_resume_checkpoint(out, move_incomplete=args.process_index == 0)
    return resume


def prepare_output_dir(cfg: RunConfig, out: Path, hparams: dict[str, Any], resume: Any) -> None:
    """Main process only: create output_dir, clear a previous run if asked (never when resuming), write config."""
    out.mkdir(parents=True, exist_ok=True)
    if cfg.run.overwrite_output_dir and not resume:
        _clear_previous(out)
    _write_config(cfg, out, hparams)


def print_result(summary: dict[str, Any], out: Path) -> None:
    """The end of a run on the terminal: the result as one JSON line (for scripts), then where it was written and
    the next command to look at it."""
    keys = ("status", "optimizer", "model_size", "num_params", "steps", "final_train_loss", "final_eval_loss",
            "optimizer_state_bytes", "train_runtime_s")
    print(json.dumps({k: summary.get(k) for k in keys}))
    names = [n for n in (SUMMARY_FILE, METRICS_FILE, CONFIG_FILE, "README.md") if (out / n).is_file()]
    n_ckpt = sum(1 for p in out.glob("checkpoint-*") if re.fullmatch(r"checkpoint-\d+", p.name))
    if n_ckpt:
        names.append(f"{n_ckpt} checkpoint{'s' if n_ckpt > 1 else ''}")
    print(f"wrote {out} ({', '.join(names)})")
    print(f"next: cat {out / SUMMARY_FILE}   or   hf-optbench report {out.parent}  (tables and plots of every run "
          f"in {out.parent})", flush=True)


def finished_run_summary(cfg: RunConfig, out: Path) -> dict[str, Any] | None:
    """A resume of a run that already finished is a no-op that says so (its summary, untouched), not more steps past
    max_steps that rewrite its results; None when the run is not finished or is being overwritten."""
    resume = cfg.training.resume_from_checkpoint
    if not resume or str(resume).lower() == "false" or cfg.run.overwrite_output_dir:
        return None
    summary = read_summary(out)
    if not summary or summary.get("status") not in FINISHED_STATUSES:
        return None
    if cfg.training.process_index == 0:
        print(f"[hf_optbench] '{out}' already holds a finished run (status '{summary['status']}', "
              f"{summary.get('steps')} steps): nothing to resume, nothing written. To train it again, use a new "
              "output_dir or --overwrite_output_dir true.", file=sys.stderr, flush=True)
    return summary
