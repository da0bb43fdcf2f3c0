"""One benchmark run: recipe -> GPT-2 from scratch -> Trainer with our optimizer and callbacks -> run directory.

    python -m hf_optbench.run recipes/quickstart_cpu.yaml --optimizer lion --max_steps 100
    accelerate launch --config_file accelerate_configs/t4x2_ddp.yaml -m hf_optbench.run recipes/lion_gpt2_large.yaml
    hf-optbench run recipes/quickstart_cpu.yaml

The optimizer and schedule are built here and handed to a stock ``transformers.Trainer`` through its own hooks
(``optimizer_cls_and_kwargs``, and ``lr_scheduler_type`` set to the same schedule; see :mod:`hf_optbench.run.trainer`),
which survive DeepSpeed's re-initialisation; there is no Trainer subclass. Our measurement callbacks are attached
with :func:`hf_optbench.measure.recorder.attach_callbacks`, ahead of the report_to integrations.

:func:`train` is a sequence of named steps, each called once, its result passed on. The other modules of the run
layer (:mod:`hf_optbench.run`) hold the checks before transformers is imported, the directory lock, the identity a
resume must match, the record of what ran, the output directory, summary.json, training time over resumed processes,
provenance and progress; :mod:`hf_optbench.publish` holds the card and the upload.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_optbench.config.argv import help_requested, recipe_first
from hf_optbench.config.hparams import resolve_hyperparameters
from hf_optbench.config.parse import RunConfig, parse_args
from hf_optbench.errors import OptBenchError
from hf_optbench.publish.hub import check_push_possible, hub_callbacks, trainer_arguments
from hf_optbench.run.console import ConsoleProgress
from hf_optbench.run.lock import RunLock, is_launch_main_process
from hf_optbench.run.output import (
    finished_run_summary,
    prepare_output_dir,
    print_result,
    resolve_resume,
    save_final_model,
)
from hf_optbench.run.preflight import own_output_dir, preflight
from hf_optbench.run.provenance import git_state
from hf_optbench.run.summary import build_summary, finish_summary, record_failure
from hf_optbench.rundir import FINISHED_STATUSES, SUMMARY_FILE, write_json_atomic

if TYPE_CHECKING:
    import torch
    from torch.optim.lr_scheduler import LRScheduler
    from transformers import Trainer


@dataclass
class Prepared:
    """What a recipe resolves to before training: tools such as find-lr reuse it without a Trainer."""

    model: Any
    train_dataset: Any
    eval_dataset: Any
    data_collator: Any
    tokenizer: Any
    bundle: Any


def prepare(cfg: RunConfig) -> Prepared:
    """Tokenizer + packed datasets + a freshly initialised model, all from the recipe."""
    from transformers import default_data_collator, set_seed

    from hf_optbench.data.pipeline import check_model_vocab, prepare_data
    from hf_optbench.models import build_model

    n_positions = cfg.model.n_positions or cfg.data.block_size
    # Rank 0 tokenizes and caches first; the other ranks then load the memory-mapped cache (run_clm's pattern).
    with cfg.training.main_process_first(desc="tokenize and pack"):
        bundle = prepare_data(cfg.data, n_positions=n_positions)
    set_seed(cfg.training.seed)  # the init depends only on the seed, not on what data loading consumed
    model = build_model(
        cfg.model.model_size,
        bundle.vocab_size,
        n_positions=n_positions,
        bos_token_id=bundle.bos_token_id,
        eos_token_id=bundle.eos_token_id,
        pad_token_id=bundle.pad_token_id,
        attn_implementation=cfg.model.attn_implementation,
        pad_vocab_to_multiple_of=cfg.model.pad_vocab_to_multiple_of,
        init_from=cfg.model.init_from,
        dropout=cfg.model.dropout,
    )
    check_model_vocab(bundle, model.config.vocab_size)
    return Prepared(model, bundle.train, bundle.eval, default_data_collator, bundle.tokenizer, bundle)


def _check_eval_split(cfg: RunConfig, prepared: Prepared) -> None:
    """The training split must hold one micro-batch per process (else no step runs). With dataloader_drop_last (kept so that every train step sees the same number of tokens) the eval loader
    also drops its partial batch: an eval (or tuning) split smaller than one eval batch would silently evaluate
    nothing."""
    args = cfg.training
    per_step = args.per_device_train_batch_size * args.world_size
    if args.dataloader_drop_last and len(prepared.train_dataset) < per_step:
        # no full micro-batch: the Trainer would take 0 steps and the run would read "completed" with no loss
        raise OptBenchError(
            f"the training split holds {len(prepared.train_dataset)} blocks of {cfg.data.block_size} tokens, fewer "
            f"than one micro-batch (per_device_train_batch_size {args.per_device_train_batch_size} x "
            f"{args.world_size} processes): no step could run. Lower per_device_train_batch_size, or use more data.")
    per_eval_step = args.per_device_eval_batch_size * args.world_size
    tuning = tuning_dataset(prepared)
    splits = [("validation", prepared.eval_dataset, args.eval_strategy != "no", "the validation split"),
              ("tuning", tuning, tuning is not None, "tuning_blocks")]
    for name, dataset, used, grow in splits:
        n = len(dataset) if dataset is not None else 0
        if used and args.dataloader_drop_last and n < per_eval_step:
            raise OptBenchError(
                f"the {name} split holds {n} blocks of {cfg.data.block_size} tokens, fewer than one eval batch "
                f"(per_device_eval_batch_size {args.per_device_eval_batch_size} x {args.world_size} processes): "
                f"evaluation would see nothing. Lower per_device_eval_batch_size"
                f"{f' (--per_device_eval_batch_size {n // args.world_size} fits)' if n >= args.world_size else ''}, "
                f"enlarge {grow}, or use more data.")


def tuning_dataset(prepared: Prepared) -> Any:
    """The held-out split learning rates are selected on (disjoint from train and eval), or None without one."""
    tuning = getattr(prepared.bundle, "tuning", None)
    return tuning if tuning is not None and len(tuning) > 0 else None


def _check_git(cfg: RunConfig) -> dict[str, Any]:
    """The code's git state, for the summary; with require_clean_git, refuse a tree with uncommitted changes."""
    git = git_state()
    if cfg.run.require_clean_git and git["dirty"]:
        raise OptBenchError(
            "require_clean_git is set and the hf_optbench source tree has uncommitted changes: commit them, "
            "or drop --require_clean_git."
        )
    return git


def build_optimization(cfg: RunConfig, model: torch.nn.Module) -> tuple[Any, Any, str]:
    """(optimizer, scheduler, schedule name) for the model; a schedule-free optimizer gets schedule "none" (its
    warmup is inside the optimizer)."""
    from hf_optbench.optim.registry import build_optimizer, is_schedule_free
    from hf_optbench.optim.schedules import build_scheduler

    args = cfg.training
    optimizer = build_optimizer(
        cfg.optim.optimizer,
        model,
        lr=args.learning_rate,
        weight_decay=args.weight_decay,
        model_size=cfg.model.model_size,
        embedding_state_32bit=cfg.optim.embedding_state_32bit,
        **cfg.optim.kwargs(),
    )
    schedule = "none" if is_schedule_free(optimizer) else cfg.optim.schedule
    scheduler = build_scheduler(
        schedule,
        optimizer,
        num_training_steps=args.max_steps,
        warmup_steps=args.warmup_steps,
        min_lr_ratio=cfg.optim.min_lr_ratio,
        **cfg.optim.schedule_kwargs_dict(),
    )
    return optimizer, scheduler, schedule


def tokens_per_optimizer_step(cfg: RunConfig) -> int:
    """Tokens one optimizer step sees over all processes (micro-batch x accumulation x world size x block)."""
    args = cfg.training
    return args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size \
        * cfg.data.block_size


def _build_callbacks(cfg: RunConfig, out: Path, model: torch.nn.Module, optimizer: Any, tokens_per_step: int,
                     resume: Any) -> tuple[list[Any], Any]:
    """(callbacks, the recorder among them): measurements, the optimizer's own callbacks, console progress."""
    from hf_optbench.measure.flops import flops_per_token
    from hf_optbench.measure.recorder import default_callbacks
    from hf_optbench.optim.registry import optimizer_callbacks

    fpt = flops_per_token(model.config, seq_len=cfg.data.block_size)
    callbacks = default_callbacks(cfg.bench, str(out), tokens_per_step=tokens_per_step, flops_per_token=fpt,
                                  resume=bool(resume), write_summary=False)  # summary.json: _train_and_record
    callbacks += optimizer_callbacks(optimizer)  # schedule-free train/eval switch, Sophia's Hessian estimate
    recorder = next(c for c in callbacks if hasattr(c, "summary"))
    callbacks.append(ConsoleProgress(cfg.training.max_steps, tokens_per_step))
    return callbacks, recorder


def _build_trainer(cfg: RunConfig, prepared: Prepared, optimizer: Any, scheduler: LRScheduler | None,
                   callbacks: list[Any], record: dict[str, Any]) -> Trainer:
    """A stock Trainer: our optimizer through ``optimizer_cls_and_kwargs`` and our schedule through
    TrainingArguments (both survive DeepSpeed's re-init, :mod:`hf_optbench.run.trainer`), its TrainingArguments'
    optimizer fields set to what ran (``record``, :mod:`hf_optbench.run.what_ran`), eval accuracy
    (:mod:`hf_optbench.run.eval_metrics`), our callbacks before the report_to integrations (``attach_callbacks``: they
    then receive the optbench/ figures), the ``hf_optbench`` tracker config after them; no per-step printers."""
    from transformers import Trainer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from transformers.utils.logging import disable_progress_bar

    from hf_optbench.measure.recorder import attach_callbacks
    from hf_optbench.run.eval_metrics import eval_metric_kwargs
    from hf_optbench.run.tracking import attach_tracker_config, tracker_config
    from hf_optbench.run.trainer import stock_trainer_kwargs
    from hf_optbench.run.what_ran import apply_to_training_args

    given = stock_trainer_kwargs(cfg.training, optimizer, scheduler)  # also sets args.optim / lr_scheduler_type
    has_eval = prepared.eval_dataset is not None and len(prepared.eval_dataset) > 0
    args = trainer_arguments(cfg.training)  # push_to_hub off: only hf_optbench.publish.hub uploads (the staged set)
    apply_to_training_args(args, record)  # adam_beta2, weight_decay, ...: what ran, for trackers and checkpoints
    trainer = Trainer(
        model=prepared.model,
        args=args,
        train_dataset=prepared.train_dataset,
        eval_dataset=prepared.eval_dataset,
        data_collator=prepared.data_collator,
        processing_class=prepared.tokenizer,
        **given,
        **(eval_metric_kwargs() if has_eval else {}),
    )
    if trainer.is_deepspeed_enabled and given["optimizers"][1] is not None:
        raise OptBenchError(
            f"schedule '{cfg.optim.schedule}' has no transformers lr_scheduler_type, which DeepSpeed rebuilds the "
            "schedule from: use gpt3_cosine, wsd, constant_with_warmup or constant with DeepSpeed."
        )
    trainer.remove_callback(PrinterCallback)  # replaced by ConsoleProgress
    trainer.remove_callback(ProgressCallback)
    if cfg.training.disable_tqdm:
        disable_progress_bar()  # also save_pretrained's "Writing model shards" bar at each checkpoint
    attach_callbacks(trainer, callbacks)  # recorder, optimizer callbacks, console progress, ... in this order
    extra = {"model_size": cfg.model.model_size, "seed": cfg.training.seed,
             "tokens_per_step": tokens_per_optimizer_step(cfg), "block_size": cfg.data.block_size}
    attach_tracker_config(trainer, tracker_config(record, extra=extra))
    return trainer


def _fit(trainer: Trainer, prepared: Prepared, recorder: Any, resume: Any, summary: dict[str, Any]) -> None:
    """trainer.train(), then a final evaluation at the last step if the schedule of evals missed it, and the
    final loss on the tuning split."""
    trainer.train(resume_from_checkpoint=resume or None)
    status = recorder.status
    last_eval_step = next((row.get("step") for row in reversed(trainer.state.log_history)
                           if "eval_loss" in row), None)
    has_eval = prepared.eval_dataset is not None and len(prepared.eval_dataset) > 0
    if status != "diverged" and has_eval and last_eval_step != trainer.state.global_step:
        trainer.evaluate()  # the final eval loss is always measured at the last step
    summary["final_tuning_loss"] = _tuning_loss(trainer, prepared) if status != "diverged" else None
    summary["status"] = status
    trainer.save_state()


def _tuning_loss(trainer: Trainer, prepared: Prepared) -> float | None:
    """The final model's loss on the tuning split, or None without one. Through ``evaluation_loop`` (what ``evaluate`` runs, every rank taking part in the gather) rather than
    ``evaluate``, which would log it and call ``on_evaluate``: the tuning loss selects learning rates and must not
    appear among the reported eval metrics (metrics.jsonl, log history, report_to). ``get_test_dataloader``
    because ``get_eval_dataloader`` hands back the cached eval loader when workers persist.
    """
    tuning = tuning_dataset(prepared)
    if tuning is None:
        return None
    output = trainer.evaluation_loop(trainer.get_test_dataloader(tuning), description="Tuning",
                                     prediction_loss_only=True, metric_key_prefix="tuning")
    loss = output.metrics.get("tuning_loss")
    return float(loss) if loss is not None else None


def _train_and_record(trainer: Trainer, prepared: Prepared, recorder: Any, optimizer: Any, *, resume: Any,
                      summary: dict[str, Any], tokens_per_step: int, summary_path: Path | None,
                      segments: Any) -> None:
    """Train, and write summary.json (to ``summary_path``, main process) whatever happens: a failure is recorded,
    then re-raised, so the run's measurements so far are kept on disk. ``train_runtime_s`` is the whole run's:
    the sum of its segments (every process that trained it, see :mod:`hf_optbench.run.segments`)."""
    started = time.time()
    segments.start_clock()
    try:
        _fit(trainer, prepared, recorder, resume, summary)
    except Exception as exc:
        record_failure(summary, exc, started)
        segments.close(trainer.state, write=summary_path is not None)
        raise
    finally:
        used = trainer.optimizer if trainer.optimizer is not None else optimizer
        finish_summary(summary, trainer.state, recorder, used, tokens_per_step)
        if segments.current is not None:
            summary.update(segments.summary())
        if summary_path is not None:
            write_json_atomic(summary_path, summary)


def _publish(cfg: RunConfig, out: Path, target: Any = None) -> None:
    """Main process only: the model card (README.md) and, with push_to_hub, the upload to ``target`` (the
    ``check_push_possible`` answer the run got before any work; asked here only by a caller without it)."""
    if target is None and cfg.training.push_to_hub:
        target = check_push_possible(cfg.training, out)
    if cfg.run.write_model_card:
        from hf_optbench.publish.card import write_model_card

        write_model_card(out)
    if target is not None:
        # Our own upload of the staged set (safetensors weights, config, tokenizer, card, metrics, summary; never
        # training_args.bin, which pickles the arguments) rather than trainer.push_to_hub(), which uploads output_dir.
        from hf_optbench.publish.hub import push_run

        push_run(out, target.repo_id, private=target.private, revision=target.revision, owner_from_token=True)


def _teardown_distributed() -> None:
    """Destroy the process group: measured here, 2 of 11 two-process CPU (gloo) runs aborted with SIGABRT at exit
    without destroy_process_group()."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def train(cfg: RunConfig, *, lock: RunLock | None = None) -> dict[str, Any]:
    """Run one benchmark run and return its summary (also written to ``output_dir/summary.json``). The main
    process owns output_dir for the whole run: ``lock`` (what :func:`main` took), else one taken here before any
    data or model work. Each step runs once and hands its result on."""
    from hf_optbench.run.segments import SegmentRecorder
    from hf_optbench.run.what_ran import value_sources, what_ran

    args = cfg.training
    out = Path(args.output_dir)
    is_main = args.process_index == 0
    finished = finished_run_summary(cfg, out)
    if finished is not None:
        return finished
    hub_target = check_push_possible(args, out)  # offline / no token / pickling hub_strategy: exit 2 now
    owner = lock if lock is not None else own_output_dir(cfg)
    try:
        git = _check_git(cfg)
        hparams = resolve_hyperparameters(cfg)  # fills learning_rate / weight_decay / max_grad_norm in cfg
        resume = resolve_resume(cfg, out)
        prepared = prepare(cfg)
        _check_eval_split(cfg, prepared)
        optimizer, scheduler, schedule = build_optimization(cfg, prepared.model)
        record = what_ran(optimizer, scheduler, hparams=hparams, sources=value_sources(cfg))
        tokens_per_step = tokens_per_optimizer_step(cfg)
        callbacks, recorder = _build_callbacks(cfg, out, prepared.model, optimizer, tokens_per_step, resume)
        callbacks += hub_callbacks(hub_target, out)  # hub_strategy every_save: hf_optbench's own checkpoint uploads
        segments = SegmentRecorder(out, resume=bool(resume))
        callbacks.append(segments)
        if is_main:
            prepare_output_dir(cfg, out, record, resume)
        trainer = _build_trainer(cfg, prepared, optimizer, scheduler, callbacks, record)
        summary = build_summary(cfg, prepared, record, schedule=schedule, hparams=hparams,
                                tokens_per_step=tokens_per_step, git=git)
        _train_and_record(trainer, prepared, recorder, optimizer, resume=resume, summary=summary,
                          tokens_per_step=tokens_per_step, summary_path=out / SUMMARY_FILE if is_main else None,
                          segments=segments)
        save_final_model(cfg, trainer, out, summary["status"])  # from_pretrained(output_dir) loads it
        if is_main:
            _publish(cfg, out, hub_target)
    finally:
        if owner is not None and owner is not lock:
            owner.release()
    _teardown_distributed()
    return summary


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python -m hf_optbench.run`` and ``accelerate launch -m hf_optbench.run``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if help_requested(argv):  # `RECIPE --help` too
        from hf_optbench.config.help import print_run_help

        return print_run_help(full=help_requested(argv) == "full", prog="python -m hf_optbench.run")
    lock = None
    try:
        argv = recipe_first(argv)  # `--config RECIPE` anywhere on the line: a recipe like any other
        preflight(argv)
        cfg = parse_args(argv)
        lock = own_output_dir(cfg)  # before any data or model work; released when the run ends
        summary = train(cfg, lock=lock)
    except OptBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        if lock is not None:
            lock.release()
    if is_launch_main_process():
        print_result(summary, Path(cfg.training.output_dir))
    return 0 if summary["status"] in FINISHED_STATUSES else 1


def exit_process(code: int) -> None:
    """End the process with ``code``; in a multi-process run, without interpreter finalization.

    Why: Gloo's worker threads can still hold work objects when the interpreter is torn down, and their destruction
    then aborts the process (SIGABRT, "terminate called without an active exception") after all results were
    written, even after destroy_process_group() (seen here in CI; pytorch/pytorch PR #179291 describes the cause
    and was abandoned upstream). Everything is already flushed to disk at this point; W&B is finished explicitly
    because its own atexit hook would be skipped.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        wandb = sys.modules.get("wandb")
        if wandb is not None and getattr(wandb, "run", None) is not None:
            wandb.finish()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
