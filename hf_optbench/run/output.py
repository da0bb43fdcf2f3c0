"""What a run does to its output_dir: clear a previous run when asked to overwrite it, write the rerunnable
``config.yaml`` and the plan's identity (rendered from the run's plan), save the final model, print the result, and
answer a resume of a run that already finished. Which checkpoint a resume loads is :mod:`hf_optbench.run.identity`'s.

Checks that need no work (a finished run is not overwritten by accident, an unfinished one is not silently
restarted) are in :func:`hf_optbench.config.parse.check_output_dir`, before anything is built.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_optbench.config.parse import RunConfig
from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import (
    CONFIG_FILE,
    FINISHED_STATUSES,
    IDENTITY_FILE,
    METRICS_FILE,
    SEGMENTS_FILE,
    SUMMARY_FILE,
    TRAINER_STATE_FILE,
    read_summary,
    write_json_atomic,
)

if TYPE_CHECKING:
    from transformers import Trainer

    from hf_optbench.run.identity import Resumption
    from hf_optbench.run.plan import RunPlan

RUN_FILES = (SUMMARY_FILE, METRICS_FILE, CONFIG_FILE, TRAINER_STATE_FILE, "README.md", SEGMENTS_FILE,
             # the final model (trainer.save_model): a stale one would be taken for the new run's weights
             "model.safetensors", "model.safetensors.index.json", "config.json", "generation_config.json",
             "training_args.bin")


def rerun_config(plan: RunPlan, record: dict[str, Any]) -> dict[str, Any]:
    """config.yaml's values: every value as a recipe holds it, the resolved ones from the plan (learning rate,
    weight decay, clipping: a tuned or cited value is written as the value it resolved to), so that ``hf-optbench
    run RUN_DIR/config.yaml`` reruns the run (CLI overrides included) to the same plan. Left out: the
    TrainingArguments fields a recipe may not set (``config.checks.REPLACED_TRAINING_KEYS``), those a recipe's
    TrainingArguments keys were translated from (``config.trainer_keys.SPELLINGS``: ``optim``,
    ``lr_scheduler_type``, ``num_train_epochs``...: config.yaml holds what they became, ``max_steps`` the steps the
    epochs came to) and the resume flag (a rerun starts afresh). ``adam_beta1``/``adam_beta2``/``adam_epsilon`` hold what ran (``record``)
    for the AdamW family, which honours them (the same values then leave optimizer_kwargs); other optimizers refuse
    them, so they are left out there."""
    from hf_optbench.config.checks import ADAM_KEYS, REPLACED_TRAINING_KEYS, adam_family
    from hf_optbench.config.trainer_keys import SPELLINGS
    from hf_optbench.optim.held import training_args_fields
    from hf_optbench.publish.redact import scrub_secrets

    cfg = plan.args
    resolved = scrub_secrets(cfg.to_dict())
    for key in (*REPLACED_TRAINING_KEYS, *SPELLINGS, "resume_from_checkpoint", *ADAM_KEYS):
        resolved.pop(key, None)
    resolved.update({k: record["hyperparameters"][k]["value"] for k in ("learning_rate", "weight_decay",
                                                                         "max_grad_norm")})
    user_kwargs = cfg.optim.kwargs()
    if cfg.optim.optimizer in adam_family():
        fields = training_args_fields(record)
        adam = {k: fields[k] for k in ADAM_KEYS if k in fields}
        resolved.update(adam)
        moved = {ADAM_KEYS[k] for k in adam}
        user_kwargs = {k: v for k, v in user_kwargs.items() if k not in moved}
    ns = plan.optimizer.constructor.get("ns_precision")
    if ns is not None:  # Muon's Newton-Schulz precision as it ran: auto would pick again on the machine it reruns on
        user_kwargs = {**user_kwargs, "ns_precision": ns.value}
    resolved["optimizer_kwargs"] = json.dumps(user_kwargs, sort_keys=True)
    resolved["num_processes"] = plan.batch.world_size  # a rerun on another number refuses (config.parse)
    if "min_lr_ratio" not in plan.schedule and "min_lr_ratio" not in cfg.explicit:
        resolved.pop("min_lr_ratio", None)  # a schedule without a floor (transformers' cosine): it had no effect
    return json.loads(json.dumps(resolved, default=str))


def _ran_comment(record: dict[str, Any]) -> str:
    """Comment lines naming what ran: the optimizer, its implementation, the schedule and each hyperparameter's
    value (their sources are in summary.json ``hyperparameters``)."""
    import textwrap

    values = ", ".join(f"{k} {json.dumps(v['value'])}" for k, v in record["hyperparameters"].items())
    text = (f"What ran: optimizer {record['optimizer']} ({record['optimizer_impl']}), schedule "
            f"{record['schedule'].get('name', 'none')}; {values}. Sources: summary.json 'hyperparameters'.")
    return "".join(f"# {line}\n" for line in textwrap.wrap(text, 108))


def rerun_line(out: Path, launch: dict[str, Any], new_dir: str = "NEW_DIR") -> str:
    """The command that reruns the run in ``out`` from its config.yaml: under the launcher it ran with
    (``launch``: :func:`hf_optbench.measure.provenance.launch_record`), e.g. ``accelerate launch --config_file
    accelerate_configs/cpu_ddp2.yaml -m hf_optbench.run RUN/config.yaml --output_dir NEW_DIR`` for a 2-process
    run, ``hf-optbench run RUN/config.yaml ...`` for one plain process."""
    from hf_optbench.publish.card import rerun_command

    return rerun_command(launch.get("rerun_prefix"), str(out / CONFIG_FILE), new_dir)


def _launch_comment(launch: dict[str, Any]) -> str:
    processes = int(launch.get("processes") or 1)
    how = " ".join(["accelerate launch" if launch.get("launcher") == "accelerate launch" else
                    launch.get("launcher") or "one plain process", *map(str, launch.get("options") or [])])
    return (f"# Launched: {how}; {processes} process{'es' if processes > 1 else ''}, mixed precision "
            f"{launch.get('mixed_precision')} (num_processes below: a rerun on another number stops, naming both).\n")


def _write_config(plan: RunPlan, out: Path, record: dict[str, Any]) -> None:
    """config.yaml: :func:`rerun_config`, secrets removed, under comments that say how to rerun it (the launch
    line that reproduces it, :func:`rerun_line`), how it was launched and what ran."""
    from hf_optbench.measure.provenance import launch_record, precision_name
    from hf_optbench.yaml_file import dump_yaml

    launch = launch_record(plan.batch.world_size, precision_name(plan.args.training))
    (out / CONFIG_FILE).write_text(
        "# Resolved configuration of this run (recipe + CLI + defaults); secrets removed. Rerun it with\n"
        f"#   {rerun_line(out, launch)}\n"
        + _launch_comment(launch)
        + _ran_comment(record)
        + dump_yaml(rerun_config(plan, record)),
        encoding="utf-8",
    )


def _clear_previous(out: Path) -> None:
    """--overwrite_output_dir: remove what a previous run wrote (only hf_optbench/Trainer outputs)."""
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for child in out.glob("checkpoint-*"):
        shutil.rmtree(child, ignore_errors=True)


def prepare_output_dir(plan: RunPlan, out: Path, record: dict[str, Any], resumption: Resumption | None) -> None:
    """Main process only: create output_dir, clear a previous run if asked (never when resuming), write config.yaml
    (``record``: what ran, :func:`hf_optbench.run.plan.plan_record`) and ``run_identity.json`` (the plan's identity,
    for readers such as the report; a resume checks the stamp inside the checkpoint it loads instead)."""
    out.mkdir(parents=True, exist_ok=True)
    if plan.args.run.overwrite_output_dir and resumption is None:
        _clear_previous(out)
    _write_config(plan, out, record)
    write_json_atomic(out / IDENTITY_FILE, {"schema": 2, "plan_hash": plan.plan_hash,
                                            "identity": dict(plan.identity)})


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
    hints = [f"cat {shlex.quote(str(out / SUMMARY_FILE))}", f"{rerun_line(out, summary.get('launch') or {}, f'{out}_rerun')}  (rerun it)"]
    if model:
        hints.append(f'GPT2LMHeadModel.from_pretrained("{out}")')
    print("next: " + "   or   ".join(hints), flush=True)


def finished_run_summary(cfg: RunConfig, out: Path) -> dict[str, Any] | None:
    """A resume of a run that already finished is a no-op that says so in one line (on the main process) and returns
    its summary, untouched: not more steps past max_steps that rewrite its results, whatever else was asked
    (--overwrite_output_dir does not apply to a resume); None when no resume was asked or the run is not finished."""
    if not cfg.resume.requested:
        return None
    summary = read_summary(out)
    if not summary or summary.get("status") not in FINISHED_STATUSES:
        return None
    if cfg.training.process_index == 0:
        status = "" if summary["status"] == "completed" else f" (status '{summary['status']}')"
        print(f"{out} already finished at step {summary.get('steps')}{status}: nothing to do ({SUMMARY_FILE} "
              "unchanged). To train it again, use a new --output_dir, or --overwrite_output_dir true without "
              "--resume_from_checkpoint.", flush=True)
    return summary


def check_steps_left(resumption: Resumption | None, max_steps: int) -> None:
    """A checkpoint at max_steps leaves nothing to train: the Trainer would still take one more step (transformers
    checks max_steps only after a step), so such a resume is refused (exit 2) before any work. Its run stopped after
    its last checkpoint without a finished summary.json (a finished one is answered by
    :func:`finished_run_summary`)."""
    if resumption is not None and resumption.step >= max_steps:
        raise OptBenchError(
            f"cannot resume from {resumption.checkpoint}: it is at step {resumption.step} and the run's max_steps is "
            f"{max_steps}, so nothing is left to train (the run stopped after its last checkpoint, before "
            f"{SUMMARY_FILE} said it finished). Its weights are that checkpoint's; to train the run again with full "
            "records, use --overwrite_output_dir true without --resume_from_checkpoint."
        )
