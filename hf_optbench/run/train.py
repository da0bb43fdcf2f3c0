"""One benchmark run: recipe -> one resolved plan -> GPT-2 from scratch -> Trainer with our optimizer and callbacks
-> run directory.

    python -m hf_optbench.run recipes/quickstart_cpu.yaml --optimizer lion --max_steps 100
    accelerate launch --config_file accelerate_configs/t4x2_ddp.yaml -m hf_optbench.run recipes/lion_gpt2_large.yaml
    hf-optbench run recipes/quickstart_cpu.yaml

:func:`train` resolves the run's plan once (:mod:`hf_optbench.run.plan`: every value with its source, validated,
and its identity) and hands it to every step, each called once: the checkpoint a resume loads (its own stamped
identity must match, :mod:`hf_optbench.run.identity`), the data and the model, the optimizer as planned (checked
group by group), TrainingArguments rendered from the plan for a stock ``transformers.Trainer`` (the optimizer
through ``optimizer_cls_and_kwargs``, the schedule through ``lr_scheduler_type``, which survive DeepSpeed's
re-initialisation; :mod:`hf_optbench.run.trainer`), our callbacks (:func:`hf_optbench.measure.recorder.
attach_callbacks`, ahead of the report_to integrations), config.yaml and summary.json rendered from the plan
(:mod:`hf_optbench.run.output`, :mod:`hf_optbench.run.summary`); :mod:`hf_optbench.publish` holds the card and the
upload. There is no Trainer subclass.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_optbench.config.argv import help_requested, recipe_first
from hf_optbench.config.parse import RunConfig, parse_args
from hf_optbench.errors import OptBenchError
from hf_optbench.measure.provenance import git_state
from hf_optbench.publish.hub import check_push_possible, hub_callbacks, trainer_arguments
from hf_optbench.run.console import ConsoleProgress
from hf_optbench.run.lock import RunLock, is_launch_main_process
from hf_optbench.run.output import (
    check_steps_left,
    finished_run_summary,
    prepare_output_dir,
    print_result,
    save_final_model,
)
from hf_optbench.run.preflight import own_output_dir, preflight
from hf_optbench.run.summary import build_summary, finish_summary, record_failure
from hf_optbench.rundir import FINISHED_STATUSES, INTERRUPTED, SUMMARY_FILE, write_json_atomic

if TYPE_CHECKING:
    import torch
    from transformers import Trainer

    from hf_optbench.run.identity import Resumption
    from hf_optbench.run.plan import RunPlan


@dataclass
class Prepared:
    """What a plan resolves to before training: tools such as find-lr reuse it without a Trainer."""

    model: Any
    train_dataset: Any
    eval_dataset: Any
    data_collator: Any
    tokenizer: Any
    bundle: Any


@dataclass
class Built:
    """The optimizer built from the plan, its builder's implementation string, its param groups as checked against
    the plan (``plan.what_ran``), and the scheduler object for a schedule transformers has no type for (one_cycle;
    otherwise the Trainer builds the schedule from the plan's TrainingArguments, once)."""

    optimizer: Any
    impl: str
    groups: list[dict[str, Any]]
    scheduler: Any = None


def prepare(plan: RunPlan) -> Prepared:
    """Tokenizer + packed datasets + a freshly initialised model, all from the plan. What can be refused is
    refused as soon as it is known: the splits against the batch and the memory the model needs, from the
    settings alone before any data is read (:func:`check_before_data`, in :func:`checked_plan`), then from the data
    itself before the model is built."""
    from transformers import default_data_collator, set_seed

    from hf_optbench.data.pipeline import check_model_vocab, prepare_data
    from hf_optbench.models import build_model
    from hf_optbench.run.memory_fit import check_memory_fits
    from hf_optbench.run.write_failure import cache_write_failures

    cfg = plan.args
    # Rank 0 tokenizes and caches first; the other ranks then load the memory-mapped cache (run_clm's pattern).
    with cfg.training.main_process_first(desc="tokenize and pack"), cache_write_failures(cfg.data.resolved_cache_dir()):
        bundle = prepare_data(cfg.data, n_positions=plan.model.n_positions)
    tuning = getattr(bundle, "tuning", None)
    _check_splits(plan, len(bundle.train), len(bundle.eval) if bundle.eval is not None else 0,
                  len(tuning) if tuning is not None else 0)
    check_memory_fits(plan, bundle.vocab_size)  # the exact figure, with the tokenizer's vocabulary
    set_seed(cfg.training.seed)  # the init depends only on the seed, not on what data loading consumed
    model = build_model(
        plan.model.model_size,
        bundle.vocab_size,
        n_positions=plan.model.n_positions,
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


def checked_plan(cfg: RunConfig, *, move: bool) -> tuple[RunPlan, Any]:
    """The plan (every value resolved and checked once; nothing writes back into it) and the checkpoint a resume
    loads (its own identity must match; ``move``: damaged ones set aside), after every refusal the settings decide
    before any data (:func:`check_before_data`). The run's steps up to its data, and ``validate --full``'s."""
    from hf_optbench.run.identity import choose_checkpoint
    from hf_optbench.run.plan import resolve_plan

    plan = resolve_plan(cfg)
    resumption = choose_checkpoint(plan, Path(cfg.training.output_dir), move=move)
    check_steps_left(resumption, plan.max_steps)
    check_before_data(plan)
    return plan, resumption


def validate_run(cfg: RunConfig) -> None:
    """Every check a run makes before its data (``hf-optbench validate --full``), writing nothing: the push, the
    plan, the resume's checkpoint, the splits and memory the settings give. ``num_train_epochs`` are counted as one
    step each here (a lower bound: the run counts them from the training split)."""
    check_push_possible(cfg.training, Path(cfg.training.output_dir))
    if cfg.trainer_keys.epochs is not None:
        training = copy.copy(cfg.training)
        training.max_steps = max(math.ceil(cfg.trainer_keys.epochs), 1)
        cfg = dataclasses.replace(cfg, training=training)
    checked_plan(cfg, move=False)


def check_before_data(plan: RunPlan) -> None:
    """The refusals the settings alone decide, before any data is generated, read or tokenized: the splits' sizes
    where the settings give them (``data.pipeline.planned_split_sizes``: the synthetic source's exactly, a text
    source's training split at most ``max_train_tokens``) against the batch, and the model's memory with the
    vocabulary the settings give (synthetic) or one row for it (a lower bound: the tokenizer is not loaded yet)."""
    from hf_optbench.data.pipeline import planned_split_sizes
    from hf_optbench.run.memory_fit import check_memory_fits

    data = plan.args.data
    planned = planned_split_sizes(data)
    if planned is not None:
        _check_splits(plan, planned.train, planned.eval, planned.tuning, basis=planned.basis,
                      upper_bound=not planned.exact)
    check_memory_fits(plan, data.synthetic_vocab_size if data.data_source == "synthetic" else None)


def _check_train_split(plan: RunPlan, n: int, basis: str | None = None, upper_bound: bool = False) -> None:
    """The training split must hold one whole optimizer step (micro-batch x accumulation x processes), and a run
    that passes an epoch's end must not end an epoch with a partial accumulation: transformers then steps on the
    micro-batches left (its ``remainder``), so that step would see fewer tokens than tokens_per_step and
    ``tokens_seen`` would count tokens never trained on (1000 accumulation steps over a 4-micro-batch split
    recorded 3,072,000 tokens of a 4,992-token split). ``basis``: where ``n`` comes from when the data is not built
    yet (the settings); ``upper_bound``: ``n`` is only an upper bound, so only the "fewer than" checks apply."""
    args, batch = plan.args.training, plan.batch
    per_micro = batch.per_device_train_batch_size * batch.world_size
    micro = n // per_micro if args.dataloader_drop_last else -(-n // per_micro)
    accumulation = batch.gradient_accumulation_steps
    size = f"the training split holds {'at most ' if upper_bound else ''}{n} blocks of {batch.block_size} tokens" + \
        (f" ({basis})" if basis else "")
    if micro == 0:  # the Trainer would take 0 steps and the run read "completed" with no loss
        raise OptBenchError(
            f"{size}, fewer than one micro-batch (per_device_train_batch_size {batch.per_device_train_batch_size} x "
            f"{batch.world_size} processes): no step could run. Lower per_device_train_batch_size, or use more data.")
    if micro < accumulation:
        raise OptBenchError(
            f"{size}, fewer than one optimizer step (per_device_train_batch_size "
            f"{batch.per_device_train_batch_size} x gradient_accumulation_steps {accumulation} x {batch.world_size} "
            f"processes = {per_micro * accumulation} blocks): no step could run as asked. Lower "
            "gradient_accumulation_steps or per_device_train_batch_size, or use more data.")
    if not upper_bound and args.dataloader_drop_last and micro % accumulation and plan.max_steps > micro // accumulation:
        raise OptBenchError(
            f"{size}: {micro} micro-batches per epoch, not a multiple of gradient_accumulation_steps {accumulation}, "
            f"and the run's {plan.max_steps} steps pass an epoch's end, where the last step of each epoch would see "
            f"only {micro % accumulation} micro-batches. Choose gradient_accumulation_steps dividing {micro}, or "
            "use more data.")


def _check_splits(plan: RunPlan, train: int, eval_: int | None, tuning: int | None, *, basis: str | None = None,
                  upper_bound: bool = False) -> None:
    """Before the model is built: the training split holds whole optimizer steps (:func:`_check_train_split`).
    With dataloader_drop_last (kept so that every train step sees the same number of tokens) the eval loader also
    drops its partial batch: an eval (or tuning) split smaller than one eval batch would silently evaluate
    nothing. Sizes in blocks; None: not known yet (checked once the data is built); ``basis``, ``upper_bound``: as
    for :func:`_check_train_split`."""
    args = plan.args.training
    _check_train_split(plan, train, basis, upper_bound)
    per_eval_step = args.per_device_eval_batch_size * args.world_size
    splits = [("validation", eval_, args.eval_strategy != "no", "the validation split"),
              ("tuning", tuning, bool(tuning), "tuning_blocks")]
    for name, n, used, grow in splits:
        if n is not None and used and args.dataloader_drop_last and n < per_eval_step:
            raise OptBenchError(
                f"the {name} split holds {n} blocks of {plan.batch.block_size} tokens, fewer than one eval batch "
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


def build_optimization(plan: RunPlan, model: torch.nn.Module) -> Built:
    """The optimizer exactly as planned (every constructor value given: nothing filled in here), checked group by
    group against the plan (``what_ran``: a difference fails loudly), and the scheduler object where transformers
    has no type for the schedule (one_cycle)."""
    from hf_optbench.optim.registry import build_resolved
    from hf_optbench.optim.schedules import scheduler_from_record, training_args_for_schedule
    from hf_optbench.run.plan import what_ran

    opt = plan.optimizer
    optimizer, impl = build_resolved(opt.spec or opt.name, model, lr=opt.learning_rate.value,
                                     weight_decay=opt.weight_decay.value, ctor=opt.constructor_values(),
                                     embedding_state_32bit=opt.embedding_state_32bit)
    groups = what_ran(opt, optimizer, model)
    schedule = dict(plan.schedule)
    scheduler = scheduler_from_record(schedule, optimizer) if training_args_for_schedule(schedule) is None else None
    return Built(optimizer, impl, groups, scheduler)


def _build_callbacks(plan: RunPlan, out: Path, model: torch.nn.Module, built: Built, record: dict[str, Any],
                     resumption: Resumption | None) -> tuple[list[Any], Any]:
    """(callbacks, the recorder among them): measurements (given the plan's record of what ran, for the trackers),
    the optimizer's own callbacks, console progress, the plan's stamp into every checkpoint."""
    from hf_optbench.measure.flops import flops_per_token
    from hf_optbench.measure.recorder import default_callbacks
    from hf_optbench.optim.registry import optimizer_callbacks
    from hf_optbench.run.identity import PlanStamp, plan_stamp

    batch = plan.batch
    fpt = flops_per_token(model.config, seq_len=batch.block_size)
    extra = {"model_size": plan.model.model_size, "seed": plan.args.training.seed,
             "tokens_per_step": batch.tokens_per_step, "block_size": batch.block_size}
    callbacks = default_callbacks(plan.args.bench, str(out), tokens_per_step=batch.tokens_per_step,
                                  flops_per_token=fpt, resume=resumption is not None, write_summary=False,
                                  record={**record, **extra})  # summary.json: _train_and_record
    callbacks += optimizer_callbacks(built.optimizer)  # schedule-free train/eval switch, Sophia's Hessian estimate
    recorder = callbacks[0]
    callbacks.append(ConsoleProgress(plan.max_steps, batch.tokens_per_step))
    callbacks.append(PlanStamp(plan_stamp(plan), schedule=plan.schedule))
    return callbacks, recorder


def _build_trainer(plan: RunPlan, prepared: Prepared, built: Built, callbacks: list[Any],
                   record: dict[str, Any]) -> Trainer:
    """A stock Trainer: our optimizer through ``optimizer_cls_and_kwargs`` (it survives DeepSpeed's re-init,
    :mod:`hf_optbench.run.trainer`), TrainingArguments rendered from the plan (the optimizer's values and the
    schedule's transformers type: the Trainer builds the schedule once, also under DeepSpeed), eval accuracy
    (:mod:`hf_optbench.run.eval_metrics`), our callbacks before the report_to integrations (``attach_callbacks``:
    they then receive the optbench/ figures, and the recorder attaches the ``hf_optbench`` tracker section after
    them); no per-step printers; what a step need not pay (:mod:`hf_optbench.run.step_cost`: logits' fp32 copy,
    the FLOP count's module walk, a wait for each batch's copy to the GPU, accelerate's per-step package lookup)."""
    import torch
    from transformers import Trainer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from transformers.utils.logging import disable_progress_bar

    from hf_optbench.data.block_view import block_view, ready_batches
    from hf_optbench.measure.recorder import attach_callbacks
    from hf_optbench.run.eval_metrics import eval_metric_kwargs
    from hf_optbench.run.step_cost import drop_training_logits, flops_once, package_lookup_once
    from hf_optbench.run.trainer import trainer_optimizer

    has_eval = prepared.eval_dataset is not None and len(prepared.eval_dataset) > 0
    args = trainer_arguments(plan.trainer_args(record))  # push_to_hub off: only hf_optbench.publish.hub uploads
    if args.dataloader_pin_memory and not torch.accelerator.is_available():
        args.dataloader_pin_memory = False  # nothing to pin for: torch would warn once per DataLoader it builds
    if args.dataloader_pin_memory:  # batches copied to the GPU without a wait (nanoGPT's pin + non_blocking)
        args.accelerator_config = dataclasses.replace(args.accelerator_config, non_blocking=True)
    if args.bf16 or args.fp16:  # accelerate copies every output to fp32 then; in fp32 the wrapper costs ~60 us
        drop_training_logits(prepared.model)  # no fp32 copy of the logits the training step does not use
    trainer = Trainer(
        model=prepared.model,
        args=args,
        train_dataset=block_view(prepared.train_dataset),  # tensors from the Arrow columns: no lists per step
        eval_dataset=block_view(prepared.eval_dataset),
        data_collator=ready_batches(prepared.data_collator),  # the view's batches as they come, others collated
        processing_class=prepared.tokenizer,
        optimizer_cls_and_kwargs=trainer_optimizer(built.optimizer),
        optimizers=(None, built.scheduler),
        **(eval_metric_kwargs() if has_eval else {}),
    )
    flops_once(trainer)  # total_flos without a walk over every module per micro-batch
    package_lookup_once()  # accelerate's optimizer step without an importlib lookup twice per step
    trainer.remove_callback(PrinterCallback)  # replaced by ConsoleProgress
    trainer.remove_callback(ProgressCallback)
    if args.disable_tqdm:
        disable_progress_bar()  # also save_pretrained's "Writing model shards" bar at each checkpoint
    attach_callbacks(trainer, callbacks)  # recorder, optimizer callbacks, console progress, ... in this order
    return trainer


def assemble(plan: RunPlan, prepared: Prepared, built: Built, record: dict[str, Any], out: Path, *,
             resumption: Resumption | None = None, hub_target: Any = None) -> tuple[Trainer, Any, Any]:
    """(trainer, recorder, segments): the run's Trainer with every callback it trains with, in their order (the
    measurements, the optimizer's own, console, plan stamp, checkpoint uploads, training segments). One function,
    so that ``benchmarks/`` time exactly what :func:`train` runs."""
    from hf_optbench.run.segments import SegmentRecorder

    callbacks, recorder = _build_callbacks(plan, out, prepared.model, built, record, resumption)
    callbacks += hub_callbacks(hub_target, out)  # hub_strategy every_save: hf_optbench's own checkpoint uploads
    segments = SegmentRecorder(out, resume=resumption is not None)
    callbacks.append(segments)
    return _build_trainer(plan, prepared, built, callbacks, record), recorder, segments


def _fit(trainer: Trainer, prepared: Prepared, recorder: Any, resumption: Resumption | None,
         summary: dict[str, Any]) -> None:
    """trainer.train(), then a final evaluation at the last step if the schedule of evals missed it (none with
    ``eval_strategy no``: no evaluation at all, as the split checks assume), and the final loss on the tuning
    split."""
    from hf_optbench.run.step_cost import start_up_heap_frozen

    with start_up_heap_frozen():  # no full garbage collection over start-up's objects while training
        trainer.train(resume_from_checkpoint=str(resumption.checkpoint) if resumption is not None else None)
    status = recorder.status
    last_eval_step = next((row.get("step") for row in reversed(trainer.state.log_history)
                           if "eval_loss" in row), None)
    has_eval = prepared.eval_dataset is not None and len(prepared.eval_dataset) > 0 \
        and trainer.args.eval_strategy != "no"
    if status != "diverged" and has_eval and last_eval_step != trainer.state.global_step:
        trainer.evaluate()  # the final eval loss is always measured at the last step
    summary["final_tuning_loss"] = tuning_loss(trainer, prepared) if status != "diverged" else None
    trainer.save_state()


def tuning_loss(trainer: Trainer, prepared: Prepared) -> float | None:
    """The final model's loss on the tuning split, or None without one. Through ``evaluation_loop`` (what ``evaluate`` runs, every rank taking part in the gather) rather than
    ``evaluate``, which would log it and call ``on_evaluate``: the tuning loss selects learning rates and must not
    appear among the reported eval metrics (metrics.jsonl, log history, report_to). ``get_test_dataloader``
    because ``get_eval_dataloader`` hands back the cached eval loader when workers persist.
    """
    from hf_optbench.data.block_view import block_view

    tuning = tuning_dataset(prepared)
    if tuning is None:
        return None
    output = trainer.evaluation_loop(trainer.get_test_dataloader(block_view(tuning)), description="Tuning",
                                     prediction_loss_only=True, metric_key_prefix="tuning")
    loss = output.metrics.get("tuning_loss")
    return float(loss) if loss is not None else None


def _train_and_record(trainer: Trainer, prepared: Prepared, recorder: Any, built: Built, *, out: Path,
                      resumption: Resumption | None, summary: dict[str, Any], summary_path: Path | None,
                      segments: Any) -> None:
    """Train, and write summary.json (to ``summary_path``, main process) whatever happens: a failure is recorded,
    then re-raised, so the run's measurements so far are kept on disk. A write that failed for want of room
    (:mod:`hf_optbench.run.write_failure`) becomes one exit-2 line, also recorded as the summary's ``error``; the
    records' own writes then may fail too, and the earlier files stay. ``train_runtime_s`` is the whole run's: the
    sum of its segments (every process that trained it, see :mod:`hf_optbench.run.segments`)."""
    from hf_optbench.run.write_failure import write_errno, write_failure

    started = time.time()
    segments.start_clock()
    raised: BaseException | None = None  # what ended the run, as it was raised (its status)
    failing: BaseException | None = None  # what the caller gets: a failed write becomes its one line
    try:
        _fit(trainer, prepared, recorder, resumption, summary)
    except Exception as exc:
        record_failure(summary, exc, started)
        raised = exc
        failing = write_failure(exc, out, step=trainer.state.global_step)
        if failing is None:
            failing = exc
            segments.close(trainer.state, write=summary_path is not None)
            raise
        # train_segments.json stays as the last complete checkpoint wrote it: the resume starts there
        summary["error"] = str(failing)
        raise failing from exc
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGHUP: nothing failed; the figures so far are written below
        summary["error"] = None
        raised = failing = exc
        raise
    except BaseException as exc:  # SystemExit: the figures so far are still written below
        raised = failing = exc
        raise
    finally:
        used = trainer.optimizer if trainer.optimizer is not None else built.optimizer
        finish_summary(summary, trainer.state, recorder, used, built=built.impl, model=prepared.model,
                       raised=raised)
        if segments.current is not None:
            summary.update(segments.summary())
        if summary_path is not None:
            try:
                write_json_atomic(summary_path, summary)
            except OSError as err:
                if failing is None or write_errno(err, out) is None:
                    raise  # a run that trained to its end and cannot record it: the caller says so in one line


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
    """Destroy the process group: without destroy_process_group() a two-process CPU (gloo) run can abort with
    SIGABRT at exit."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@dataclass(frozen=True)
class RunStart:
    """What :func:`main` decides once before any data or model work and hands to :func:`train`: the lock on
    output_dir (None on the other ranks) and the push target (``check_push_possible``'s; None without push_to_hub)."""

    lock: RunLock | None
    hub_target: Any


def start_run(cfg: RunConfig) -> RunStart | None:
    """None for a resume of a run that already finished (it said so in one line, and nothing was written); else the
    lock on output_dir (a live run that holds it: exit 2) and the push target (offline, no token, a hub_strategy
    that uploads pickles: exit 2), both before any data or model work."""
    if finished_run_summary(cfg, Path(cfg.training.output_dir)) is not None:
        return None
    lock = own_output_dir(cfg)  # released when the run ends
    try:
        return RunStart(lock, check_push_possible(cfg.training, Path(cfg.training.output_dir)))
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def train(cfg: RunConfig, start: RunStart) -> dict[str, Any]:
    """Run one benchmark run and return its summary (also written to ``output_dir/summary.json``). ``start``: the
    lock the main process holds on output_dir for the whole run and the push target (:func:`start_run`). The plan
    is resolved once (:func:`hf_optbench.run.plan.resolve_plan`) and every step takes it; each step runs once and
    hands its result on."""
    from hf_optbench.run.epochs import with_epoch_steps
    from hf_optbench.run.plan import plan_record

    args = cfg.training
    out = Path(args.output_dir)
    is_main = args.process_index == 0
    git = _check_git(cfg)
    cfg = with_epoch_steps(cfg)  # num_train_epochs: max_steps from the training split's size
    plan, resumption = checked_plan(cfg, move=is_main)
    prepared = prepare(plan)
    built = build_optimization(plan, prepared.model)
    record = plan_record(plan, built.groups, built.impl)
    if is_main:
        prepare_output_dir(plan, out, record, resumption)
    trainer, recorder, segments = assemble(plan, prepared, built, record, out, resumption=resumption,
                                           hub_target=start.hub_target)
    summary = build_summary(plan, prepared, record, resumption=resumption, git=git)
    recorded = False
    try:
        _train_and_record(trainer, prepared, recorder, built, out=out, resumption=resumption, summary=summary,
                          summary_path=out / SUMMARY_FILE if is_main else None, segments=segments)
        recorded = True
        save_final_model(cfg, trainer, out, summary["status"])  # from_pretrained(output_dir) loads it
    except OptBenchError:
        raise
    except Exception as exc:  # a failed write during training is an OptBenchError by now: here the records
        from hf_optbench.run.write_failure import write_failure  # or the final model could not be written

        failure = write_failure(exc, out, step=trainer.state.global_step, final_model=recorded,
                                trained=summary["status"] in FINISHED_STATUSES)
        if failure is None:
            raise
        raise failure from exc
    if is_main:
        _publish(cfg, out, start.hub_target)
    _teardown_distributed()
    return summary


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python -m hf_optbench.run`` and ``accelerate launch -m hf_optbench.run``. It decides what
    is decided before any work, once (:func:`start_run`: a finished run, the lock, the push target), and holds the
    lock until the run ends."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if help_requested(argv):  # `RECIPE --help` too
        from hf_optbench.config.help import print_run_help

        return print_run_help(full=help_requested(argv) == "full", prog="python -m hf_optbench.run")
    start = None
    cfg = None
    try:
        argv = recipe_first(argv)  # `--config RECIPE` anywhere on the line: a recipe like any other
        recipe = preflight(argv)  # the recipe, read once
        cfg = parse_args(argv, recipe=recipe)
        start = start_run(cfg)
        if start is None:
            return 0  # a finished run resumed
        with hangup_as_interrupt():
            summary = train(cfg, start)
    except OptBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        out = Path(cfg.training.output_dir) if cfg is not None else None
        print(interrupted_line(out), file=sys.stderr, flush=True)
        return 130
    finally:
        if start is not None and start.lock is not None:
            start.lock.release()
    if is_launch_main_process():
        print_result(summary, Path(cfg.training.output_dir))
    return 0 if summary["status"] in FINISHED_STATUSES else 1


@contextmanager
def hangup_as_interrupt() -> Iterator[None]:
    """SIGHUP (the terminal closed) ends a run as Ctrl-C does: summary.json written with status "interrupted" and one
    line, instead of a silent exit 129 that wrote nothing."""
    import signal

    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGHUP, interrupt)
    except (ValueError, AttributeError):  # not the main thread, or no SIGHUP (Windows)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


def interrupted_line(out: Path | None) -> str:
    """The one line a run stopped by Ctrl-C or SIGHUP ends with: where it stopped and how to go on."""
    from hf_optbench.rundir import read_summary

    summary = (read_summary(out) or {}) if out is not None else {}
    if summary.get("status") != INTERRUPTED:
        return "interrupted before training started: nothing was trained; start the same command again."
    on = ("continue it with --resume_from_checkpoint true (from its last checkpoint), or start again with "
          "--overwrite_output_dir true") if any(out.glob("checkpoint-*")) else \
        "it saved no checkpoint: start it again with --overwrite_output_dir true"
    return (f"interrupted at step {summary.get('steps')}: {out} keeps what was written (summary.json status "
            f"'{INTERRUPTED}'); {on}.")


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
