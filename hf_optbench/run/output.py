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
from typing import TYPE_CHECKING, Any

from hf_optbench.config.parse import RunConfig
from hf_optbench.errors import OptBenchError
from hf_optbench.run.identity import check_resume_identity, read_identity, record_identity
from hf_optbench.rundir import (
    CONFIG_FILE,
    FINISHED_STATUSES,
    METRICS_FILE,
    SEGMENTS_FILE,
    SUMMARY_FILE,
    TORN_CHECKPOINTS_DIR,
    TRAINER_STATE_FILE,
    read_summary,
)

if TYPE_CHECKING:
    from transformers import Trainer

RUN_FILES = (SUMMARY_FILE, METRICS_FILE, CONFIG_FILE, TRAINER_STATE_FILE, "README.md", SEGMENTS_FILE,
             # the final model (trainer.save_model): a stale one would be taken for the new run's weights
             "model.safetensors", "model.safetensors.index.json", "config.json", "generation_config.json",
             "training_args.bin")


def rerun_config(cfg: RunConfig, record: dict[str, Any]) -> dict[str, Any]:
    """config.yaml's values: every resolved value as a recipe holds it, so that ``hf-optbench run
    RUN_DIR/config.yaml`` reruns the run (CLI overrides included, they are resolved in). Left out: the
    TrainingArguments fields a recipe may not set (``config.checks.REPLACED_TRAINING_KEYS``: ``optim``,
    ``lr_scheduler_type``, ``auto_find_batch_size``... hf_optbench's optimizer and schedule replace them) and the
    resume flag (a rerun starts afresh). ``adam_beta1``/``adam_beta2``/``adam_epsilon`` hold what ran (``record``)
    for the AdamW family, which honours them (the same values then leave optimizer_kwargs); other optimizers refuse
    them, so they are left out there."""
    from hf_optbench.config.checks import ADAM_KEYS, REPLACED_TRAINING_KEYS, adam_family
    from hf_optbench.publish.redact import scrub_secrets
    from hf_optbench.run.what_ran import training_args_fields

    resolved = scrub_secrets(cfg.to_dict())
    for key in (*REPLACED_TRAINING_KEYS, "resume_from_checkpoint", *ADAM_KEYS):
        resolved.pop(key, None)
    if cfg.optim.optimizer in adam_family():
        fields = training_args_fields(record)
        adam = {k: fields[k] for k in ADAM_KEYS if k in fields}
        resolved.update(adam)
        moved = {ADAM_KEYS[k] for k in adam}
        resolved["optimizer_kwargs"] = json.dumps({k: v for k, v in cfg.optim.kwargs().items() if k not in moved},
                                                  sort_keys=True)
    return json.loads(json.dumps(resolved, default=str))


def _ran_comment(record: dict[str, Any]) -> str:
    """Comment lines naming what ran: the optimizer, its implementation, the schedule and each hyperparameter's
    value (their sources are in summary.json ``hyperparameters``)."""
    import textwrap

    values = ", ".join(f"{k} {json.dumps(v['value'])}" for k, v in record["hyperparameters"].items())
    text = (f"What ran: optimizer {record['optimizer']} ({record['optimizer_impl']}), schedule "
            f"{record['schedule'].get('name', 'none')}; {values}. Sources: summary.json 'hyperparameters'.")
    return "".join(f"# {line}\n" for line in textwrap.wrap(text, 108))


def _write_config(cfg: RunConfig, out: Path, record: dict[str, Any]) -> None:
    """config.yaml: :func:`rerun_config`, secrets removed, under comments that say how to rerun it and what ran."""
    from hf_optbench.yaml_file import dump_yaml

    (out / CONFIG_FILE).write_text(
        "# Resolved configuration of this run (recipe + CLI + defaults); secrets removed. Rerun it with\n"
        f"#   hf-optbench run {out / CONFIG_FILE} --output_dir NEW_DIR\n"
        + _ran_comment(record)
        + dump_yaml(rerun_config(cfg, record)),
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
    complete = [p for p in ckpts if (p / TRAINER_STATE_FILE).is_file()]
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
    if resume:
        if resume is True:
            resolve_resume_checkpoint(out, move_incomplete=False)  # no checkpoint to resume: that error first
        check_resume_identity(cfg, out)  # a changed run is refused before anything is moved, built or written
    if resume is True:
        resume = resolve_resume_checkpoint(out, move_incomplete=args.process_index == 0)
    return resume


def prepare_output_dir(cfg: RunConfig, out: Path, record: dict[str, Any], resume: Any) -> None:
    """Main process only: create output_dir, clear a previous run if asked (never when resuming), write config
    (``record``: what ran, :func:`hf_optbench.run.what_ran.what_ran`)."""
    out.mkdir(parents=True, exist_ok=True)
    if cfg.run.overwrite_output_dir and not resume:
        _clear_previous(out)
    _write_config(cfg, out, record)
    if not resume or read_identity(out) is None:
        record_identity(cfg, out)  # what the checkpoints are trained with; a resume must match it


def save_final_model(cfg: RunConfig, trainer: Trainer, out: Path, status: str) -> None:
    """The final model in the run directory, the Hugging Face way (``trainer.save_model``: config.json,
    model.safetensors, generation_config.json and the tokenizer), so that ``from_pretrained(output_dir)`` loads
    it; not for a diverged run (its weights are not finite) or with ``save_final_model false``. Every rank calls
    it (DeepSpeed ZeRO-3 gathers the weights); the Trainer writes on the main process only."""
    if cfg.run.save_final_model and status == "completed":
        trainer.save_model(str(out))


def print_result(summary: dict[str, Any], out: Path) -> None:
    """The end of a run on the terminal: the result as one JSON line (for scripts), then where it was written and
    the next command to look at it."""
    keys = ("status", "optimizer", "model_size", "num_params", "steps", "final_train_loss", "final_eval_loss",
            "optimizer_state_bytes", "train_runtime_s")
    print(json.dumps({k: summary.get(k) for k in keys}))
    names = [n for n in (SUMMARY_FILE, METRICS_FILE, CONFIG_FILE, "README.md") if (out / n).is_file()]
    model = (out / "model.safetensors").is_file() or (out / "model.safetensors.index.json").is_file()
    if model:
        names.append("the final model")
    n_ckpt = sum(1 for p in out.glob("checkpoint-*") if re.fullmatch(r"checkpoint-\d+", p.name))
    if n_ckpt:
        names.append(f"{n_ckpt} checkpoint{'s' if n_ckpt > 1 else ''}")
    print(f"wrote {out} ({', '.join(names)})")
    # a report compares the runs of one sweep (it refuses a directory of unrelated runs), so a single run's next
    # steps are its own: read it, rerun it, load its model
    hints = [f"cat {out / SUMMARY_FILE}", f"hf-optbench run {out / CONFIG_FILE} --output_dir {out}_rerun  (rerun it)"]
    if model:
        hints.append(f'GPT2LMHeadModel.from_pretrained("{out}")')
    print("next: " + "   or   ".join(hints), flush=True)


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
