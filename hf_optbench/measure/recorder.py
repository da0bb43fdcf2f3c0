"""The benchmark's measurements as one ``transformers.TrainerCallback``: memory, time/MFU, stability, convergence.

``OptBenchRecorder`` works in hf_optbench's runs and in anyone's ``Trainer`` (single process or distributed).
With a Trainer you build yourself, add the callbacks with :func:`attach_callbacks` after building it, so that
they run before the ``report_to`` integrations (W&B, TensorBoard, trackio), which then receive the ``optbench/``
figures::

    from transformers import Trainer, TrainingArguments
    from hf_optbench.config.bench_args import BenchArguments
    from hf_optbench.measure.recorder import attach_callbacks, default_callbacks

    args = TrainingArguments("out", max_steps=200, logging_steps=10, logging_nan_inf_filter=False,
                             eval_strategy="steps", eval_steps=50, report_to="tensorboard")
    callbacks = default_callbacks(BenchArguments(target_losses=[5.0, 4.0]), "out",
                                  tokens_per_step=8 * 256)          # global: micro-batch x accum x world x block
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val)
    attach_callbacks(trainer, callbacks)
    trainer.train()
    recorder = callbacks[0]
    recorder.status, recorder.diverged_step, recorder.summary()   # "completed"/"diverged", step, totals

``Trainer(callbacks=[recorder])`` works too: transformers calls the ``report_to`` integrations before the callbacks
given to the constructor, so at init end the recorder moves itself before them (transformers hands a callback
neither the Trainer nor its callback handler: the recorder takes the handler from the event's caller, checked to
hold it; where it cannot, it warns once at train begin, naming ``attach_callbacks``).
``attach_callbacks``, and a recorder passed as ``Trainer(callbacks=[...])`` at init end, also have the recorder watch
the Trainer's per-step loss and gradient norm (:mod:`hf_optbench.measure.step_values`): every step gets its row
whatever ``logging_steps``, read from the device at the Trainer's loss logs (and before each evaluation, save and the
end: the recorder has the Trainer log then), so on a GPU the host waits only there.

What ran: at init end and train begin the recorder reads the optimizer and the scheduler the Trainer holds (whoever
built them: ``trainer_optimizer``, ``Trainer(optimizers=(opt, sched))``, DeepSpeed's re-initialisation) with
:func:`hf_optbench.optim.held.held_record`, and sets the TrainingArguments fields hf_optbench replaces to what they
hold (``optim`` and ``optim_args``, ``learning_rate``, ``weight_decay``, the betas, ``lr_scheduler_type``, its kwargs
and ``warmup_steps`` read from the scheduler) before the ``report_to`` integrations record them. They stay so after
training: every file the Trainer writes from its arguments (checkpoints' and ``save_model``'s ``training_args.bin``,
the card of ``create_model_card`` and what ``push_to_hub`` sends) says what ran. ``attach_callbacks`` first gives
the Trainer its own copy of the arguments, so the caller's object, from which nothing is written, stays as it was;
a recorder passed as ``Trainer(callbacks=[...])`` writes into the Trainer's arguments, which are the caller's. The
``hf_optbench`` tracker section is attached after the integrations (:mod:`hf_optbench.measure.tracking`); its
summary.json names the optimizer, its hyperparameters and groups, the schedule, and every field a run of
``hf_optbench.run`` writes (:func:`hf_optbench.measure.provenance.trainer_summary`). ``hf_optbench.run`` hands it
the record rendered from its plan instead (``record=``), checked against the built optimizer.

Contract with ``hf_optbench.run.train``: ``default_callbacks(bench_args, output_dir, *, tokens_per_step, flops_per_token=None,
resume=False, write_summary=True, record=None)`` returns ``[OptBenchRecorder]``. The recorder owns
``output_dir/metrics.jsonl`` (rows as in docs/ARCHITECTURE.md, through ``runlog.RunLog``: written by the world
process zero only, buffered, flushed on eval/save/stop/end; ``summary()`` also flushes, so a caller's ``finally``
keeps the rows of a crashed run) and writes ``summary.json`` at train end by merging ``summary()`` into whatever
the file holds, unless built with ``write_summary=False`` (``hf_optbench.run`` writes the file itself, once, with
these figures merged in). Non-finite floats are written as ``null``; the divergence step is in
``summary()["diverged_step"]``. With ``resume=True`` (or whenever the Trainer resumes at ``global_step > 0``) rows
with ``step >`` the resumed step are dropped, the rest kept and replayed into the probes, so the summary covers
the whole run and no step appears twice.

What is measured lives in one probe module each (interface: ``probe_base.Probe``): ``probe_memory`` (state,
params, grads, peaks, totals over ranks), ``probe_timing`` (step time, tokens/s, MFU), ``probe_stability``
(spikes, divergence control), ``probe_convergence`` (eval perplexity, targets, AUC). The recorder builds the
base fields of each row (kind, step, tokens, ``elapsed_s`` = train wall time minus evaluation and checkpoint
saving, and for train rows epoch, loss, grad_norm, lr) and forwards the probes' figures to ``report_to``
backends by adding ``optbench/...`` keys to the ``logs`` dict the Trainer passes to every callback (W&B,
TensorBoard and trackio show them as ``train/optbench/...``; eval figures as ``eval/optbench/...``, e.g.
``eval/optbench/perplexity``).
"""

from __future__ import annotations

import copy
import os
import sys
import time
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from hf_optbench.config.bench_args import BenchArguments
from hf_optbench.measure.probe_base import Probe, Record, RunContext, finite
from hf_optbench.measure.probe_convergence import ConvergenceProbe
from hf_optbench.measure.probe_memory import MemoryProbe
from hf_optbench.measure.probe_stability import StabilityProbe
from hf_optbench.measure.probe_timing import TimingProbe
from hf_optbench.measure.runlog import RunLog
from hf_optbench.measure.step_values import StepValues
from hf_optbench.rundir import METRICS_FILE, SUMMARY_FILE, read_summary, run_status, write_json_atomic

if TYPE_CHECKING:
    from transformers import Trainer, TrainerControl, TrainerState

LOG_PREFIX = "optbench/"
EVAL_PREFIX = "eval_"


def default_callbacks(
    bench_args: BenchArguments,
    output_dir: str,
    *,
    tokens_per_step: int,
    flops_per_token: float | None = None,
    resume: bool = False,
    write_summary: bool = True,
    record: Mapping[str, Any] | None = None,
) -> list[TrainerCallback]:
    """The benchmark's callbacks for one run: ``[OptBenchRecorder]`` (see the module docstring)."""
    return [
        OptBenchRecorder(
            output_dir, bench_args, tokens_per_step=tokens_per_step, flops_per_token=flops_per_token, resume=resume,
            write_summary=write_summary, record=record,
        )
    ]


def _reporter_types() -> tuple[type, ...]:
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    return tuple(INTEGRATION_TO_CALLBACK.values())


def _placed(callbacks: list[Any], mine: list[Any]) -> list[Any]:
    """``callbacks`` with ``mine`` (moved, not duplicated) just before the first reporting integration."""
    others = [c for c in callbacks if all(c is not m for m in mine)]
    reporters = _reporter_types()
    first = next((i for i, c in enumerate(others) if isinstance(c, reporters)), len(others))
    return others[:first] + mine + others[first:]


def attach_callbacks(trainer: Trainer, callbacks: Iterable[Any]) -> None:
    """Add ``callbacks`` to an existing Trainer, in their order, just before its reporting integrations.

    The ``report_to`` callbacks (the values of transformers' ``INTEGRATION_TO_CALLBACK``) then see what ours add
    to ``logs`` in ``on_log``. Callbacks already in the Trainer are moved, not duplicated; classes are
    instantiated as ``Trainer.add_callback`` does. Call it again after adding reporting callbacks later. With a
    recorder among them, the Trainer gets its own (shallow) copy of its TrainingArguments first: the recorder sets
    their fields to what runs, and the caller's object stays as it was.
    """
    handler = trainer.callback_handler
    mine = [c() if isinstance(c, type) else c for c in callbacks]
    handler.callbacks[:] = _placed(handler.callbacks, mine)
    if any(isinstance(cb, OptBenchRecorder) for cb in mine):
        trainer.args = copy.copy(trainer.args)
    for cb in mine:
        if isinstance(cb, OptBenchRecorder):
            cb._handler = weakref.ref(handler)
            cb.steps.watch(trainer)  # every step's loss and grad norm, read at the Trainer's loss logs


def _calling_handler(callback: Any) -> tuple[Any, Any]:
    """The transformers ``CallbackHandler`` whose event is running and holds ``callback``, and the Trainer that owns
    it (its ``callback_handler``), each None where not found. Why from the call stack: transformers passes a callback
    neither its Trainer nor its handler, and the handler calling this event (``CallbackHandler.call_event``) is a few
    frames up, the Trainer calling the handler a few more; each is checked to be what it claims."""
    from transformers.trainer_callback import CallbackHandler

    frame, handler = sys._getframe(1), None
    for _ in range(10):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if handler is None and isinstance(owner, CallbackHandler) and any(cb is callback for cb in owner.callbacks):
            handler = owner
        elif handler is not None and getattr(owner, "callback_handler", None) is handler:
            return handler, owner
        frame = frame.f_back
    return handler, None


class OptBenchRecorder(TrainerCallback):
    """Measures one run and owns its ``metrics.jsonl``; ``summary()`` gives the totals (see the module docstring).

    Args:
        output_dir: run directory (``metrics.jsonl`` and ``summary.json`` go there; created if missing).
        bench_args: what to measure; ``BenchArguments()`` when None.
        tokens_per_step: tokens per optimizer step over all ranks (micro-batch x accumulation x world x block).
            None: taken from ``state.num_input_tokens_seen`` when ``include_num_input_tokens_seen`` is on, else
            tokens, tokens/s, MFU and the AUC are null.
        flops_per_token: training FLOPs per token for MFU; None: derived for GPT-2 models from the config and the
            block size implied by ``tokens_per_step`` and the batch arguments.
        resume: keep the rows up to the resumed step and append (also automatic when the Trainer resumes).
        write_summary: write ``summary.json`` at train end; False when the caller writes it (``hf_optbench.run``
            does, once, with ``summary()`` merged into its own record), so that a run has one writer.
        record: the record of what ran, from a run's plan (its trackers' ``hf_optbench`` section); None: read from
            the optimizer and scheduler the Trainer holds at train begin.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        bench_args: BenchArguments | None = None,
        *,
        tokens_per_step: int | None = None,
        flops_per_token: float | None = None,
        resume: bool = False,
        write_summary: bool = True,
        record: Mapping[str, Any] | None = None,
    ) -> None:
        self.write_summary = write_summary
        self.record = dict(record) if record is not None else None
        self._held: dict[str, Any] | None = None  # the record read from the objects (no plan record given)
        self._data: dict[str, Any] | None = None  # what the Trainer's data loaders held (Python API path)
        self._resumed_step: int | None = None
        self.bench = bench_args if bench_args is not None else BenchArguments()
        self.output_dir = Path(output_dir)
        self.resume = resume
        self.runlog = RunLog(self.output_dir / METRICS_FILE, self.bench.metrics_flush_every)
        self.ctx = RunContext(self.bench, tokens_per_step)
        self.memory = MemoryProbe()
        self.timing = TimingProbe(flops_per_token)
        self.stability = StabilityProbe(self.bench)
        self.convergence = ConvergenceProbe(self.bench)
        # the order of the fields in a row: memory, timing, stability, convergence
        self.probes: list[Probe] = [self.memory, self.timing, self.stability, self.convergence]
        self._handler: weakref.ref | None = None  # set by attach_callbacks
        self.steps = StepValues()  # watching the Trainer's per-step values: set by attach_callbacks
        self._last_train_step = -1

    # ---------------------------------------------------------------------------------------------- public state

    @property
    def path(self) -> Path:
        """``output_dir/metrics.jsonl``."""
        return self.runlog.path

    @property
    def status(self) -> str:
        """The status as measured: "completed" or "diverged" (only the caller knows about exceptions)."""
        return self.stability.status

    @property
    def diverged_step(self) -> int | None:
        return self.stability.diverged_step

    @property
    def tokens_per_step(self) -> int | None:
        return self.ctx.tokens_per_step

    @property
    def flops_per_token(self) -> float | None:
        return self.timing.flops_per_token

    def attach(self, trainer: Trainer) -> Any:
        """``attach_callbacks(trainer, [self])``; returns ``trainer``."""
        attach_callbacks(trainer, [self])
        return trainer

    def flush(self) -> None:
        """Append buffered rows to metrics.jsonl (world process zero only; no fsync)."""
        self.runlog.flush()

    # ---------------------------------------------------------------------------------------------- train begin

    def on_init_end(self, args, state, control, optimizer=None, lr_scheduler=None, model=None, **kwargs):
        """Passed as ``Trainer(callbacks=[...])``: move before the report_to integrations, which transformers put
        first (:func:`_calling_handler`). A Trainer given ``optimizers=(opt, sched)`` holds them already: say what
        they hold in its arguments now, before the integrations record them at train begin."""
        handler, trainer = _calling_handler(self) if self._handler is None else (None, None)
        if handler is not None:
            self._handler = weakref.ref(handler)
            if trainer is not None:
                self.steps.watch(trainer)  # every step's row, as attach_callbacks gives
            ahead = handler.callbacks[:next(i for i, cb in enumerate(handler.callbacks) if cb is self)]
            if any(isinstance(cb, _reporter_types()) for cb in ahead):  # a new list: this event's loop is undisturbed
                handler.callbacks = _placed(handler.callbacks, [self])
        if self.record is None and optimizer is not None:
            from hf_optbench.optim.held import held_record

            horizon = args.max_steps if args.max_steps and args.max_steps > 0 else None
            self._held = held_record(optimizer, lr_scheduler, model=model, num_training_steps=horizon, args=args)
            self._apply_to_args(args, self._held, optimizer, model)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        ctx = self.ctx
        self._check_placement(args)
        self._record_what_ran(args, kwargs.get("optimizer"), kwargs.get("lr_scheduler"), model, state.max_steps)
        self._data = _loader_sizes(kwargs.get("train_dataloader"), kwargs.get("eval_dataloader"))
        self._resumed_step = state.global_step or None
        self.runlog.writer = bool(state.is_world_process_zero)
        if ctx.tokens_per_step is None and args.include_num_input_tokens_seen in (None, "no", False):
            ctx.warn_once(
                "tokens",
                "OptBenchRecorder got no tokens_per_step and the Trainer does not count input tokens: tokens, "
                "tokens/s, MFU and the loss-vs-tokens AUC will be null. Pass tokens_per_step.",
            )
        ctx.device = args.device
        ctx.world_size = int(getattr(args, "world_size", 1) or 1)
        ctx.per_step_rows = self.steps.watched
        self.steps.reset()
        resume = self.resume or state.global_step > 0
        kept = self.runlog.start(state.global_step if resume else None)
        ctx.clock.reset()
        for row in kept:
            if row.get("elapsed_s") is not None:
                ctx.clock.observe(row["elapsed_s"])
        self._last_train_step = max((r["step"] for r in kept if r.get("kind") == "train"), default=-1)
        for probe in self.probes:
            probe.on_train_begin(ctx, args, model)
            probe.replay(kept)
        ctx.sync()
        ctx.clock.start()

    def _check_placement(self, args: Any) -> None:
        """Warn once when report_to backends would run before the recorder (they would miss optbench/ keys)."""
        if not [r for r in (args.report_to or []) if r != "none"]:
            return
        handler = self._handler() if self._handler is not None else None
        if handler is None:
            self.ctx.warn_once(
                "placement",
                "OptBenchRecorder was not added with attach_callbacks(trainer, callbacks): the report_to callbacks "
                "run before it and miss the optbench/ figures. Build the Trainer, then call "
                "hf_optbench.measure.recorder.attach_callbacks(trainer, [recorder]).",
            )
            return
        order = handler.callbacks
        mine = next((i for i, c in enumerate(order) if c is self), len(order))
        if any(isinstance(c, _reporter_types()) for c in order[:mine]):
            self.ctx.warn_once(
                "placement",
                "A report_to callback runs before OptBenchRecorder (added after attach_callbacks?): it misses the "
                "optbench/ figures. Call attach_callbacks(trainer, [recorder]) again after adding callbacks.",
            )

    def _record_what_ran(self, args: Any, optimizer: Any, scheduler: Any, model: Any, max_steps: int) -> None:
        """The record of what runs (a run's plan record, else read from the objects: the optimizer and scheduler
        the Trainer holds now), into the TrainingArguments the report_to integrations record next (when read from
        the objects) and the ``hf_optbench`` tracker section attached after them. Once per recorder."""
        from hf_optbench.measure.tracking import TrackerConfigCallback, tracker_config

        record = self.record
        if record is None:
            if optimizer is None:
                return
            from hf_optbench.optim.held import held_record

            record = self._held = held_record(optimizer, scheduler, model=model, num_training_steps=max_steps,
                                              args=args)
            self._apply_to_args(args, record, optimizer, model)
        handler = self._handler() if self._handler is not None else None
        if handler is not None and not any(isinstance(cb, TrackerConfigCallback) for cb in handler.callbacks):
            extra = {"tokens_per_step": self.ctx.tokens_per_step} if self.record is None else {}
            callback = TrackerConfigCallback(tracker_config(record, extra=extra))
            callback._handler = weakref.ref(handler)
            handler.callbacks.append(callback)  # after the integrations: their runs exist when it pushes

    def _apply_to_args(self, args: Any, record: Mapping[str, Any], optimizer: Any, model: Any) -> None:
        """Set the TrainingArguments fields hf_optbench replaces to what ``record`` says runs, in the Trainer's
        arguments, which the integrations record, checkpoints and ``save_model`` pickle and ``create_model_card``
        prints: the optimizer's (:func:`hf_optbench.optim.held.training_args_fields`) and the schedule's
        (:func:`hf_optbench.optim.held.schedule_training_fields`: its transformers type, kwargs and the warmup read
        from the scheduler; ``hf_optbench:<name>`` where transformers has no type); the optimizer's are left as
        they are where the Trainer built it from them. They are not put back: the Trainer's files written after
        training must say what ran too (see the module docstring for the caller's object)."""
        from hf_optbench.optim.held import (
            built_from_arguments,
            schedule_training_fields,
            training_args_fields,
        )

        # an optimizer the Trainer built from these very arguments: they say what runs already, and a Trainer that
        # reuses them must build it again (hf_optbench:<name> is no optim transformers can build)
        fields = {} if built_from_arguments(optimizer, args, model) else training_args_fields(record)
        if record.get("schedule"):
            fields.update(schedule_training_fields(record["schedule"]))
        for key, value in fields.items():
            setattr(args, key, value)

    # ---------------------------------------------------------------------------------------------- per step

    def on_step_begin(self, args, state, control, **kwargs):
        for probe in self.probes:
            probe.on_step_begin(self.ctx)

    def on_optimizer_step(self, args, state, control, optimizer=None, model=None, **kwargs):
        for probe in self.probes:
            for row in probe.on_optimizer_step(self.ctx, state, optimizer, model):
                self.runlog.emit(row)
        if self.steps.watched:
            self.steps.note_lr(kwargs.get("lr_scheduler"), optimizer)

    def on_step_end(self, args, state, control, **kwargs):
        for probe in self.probes:
            probe.on_step_end(self.ctx, state)
        if self.steps.watched:
            self.steps.end_step(state.global_step, state.epoch, self.ctx.tokens(state), self.ctx.clock.elapsed(),
                                self.ctx.cuda)
            if args.logging_strategy == "steps" and (control.should_evaluate or control.should_save
                                                     or control.should_training_stop):
                control.should_log = True  # the steps' rows (a divergence among them) before evaluating or saving
        self.ctx.clock.set_mark()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        forward: dict[str, Any] = {}
        if "loss" in logs and state.global_step > self._last_train_step:
            forward.update(self._train_rows(state, control, logs))
        for probe in self.probes:
            forward.update(probe.on_log(self.ctx, logs))
        if "train_runtime" in logs:  # the Trainer's final log of a train() call
            for probe in self.probes:
                forward.update({k: v for k, v in probe.final_logs(self.ctx).items() if _loggable(v)})
        logs.update({_log_key(k): v for k, v in forward.items()})
        if self.ctx.in_train:
            self.ctx.clock.set_mark()

    def _train_rows(self, state: TrainerState, control: TrainerControl,
                    logs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Write the train rows of the steps since the last ones (read from the device in one go when the Trainer
        is watched, else the logged step's from ``logs``); returns the figures to forward to report_to: the last
        step's, with a spike flag set if any of these steps had one."""
        ctx = self.ctx
        steps = self.steps.read(ctx.clock.elapsed()) if self.steps.watched else []  # the one wait, if any
        for probe in self.probes:
            probe.on_sync(ctx)
        if self.steps.watched:
            steps = [v for v in steps if v["step"] > self._last_train_step]
        elif logs is not None:
            steps = [{"step": state.global_step, "epoch": state.epoch, "tokens": ctx.tokens(state),
                      "loss": logs.get("loss"), "grad_norm": logs.get("grad_norm"), "lr": logs.get("learning_rate"),
                      "elapsed_s": ctx.clock.elapsed()}]
        else:
            return {}
        forward: dict[str, Any] = {}
        for values in steps:
            figures = self._train_row(values, control)
            for flag in ("loss_spike", "grad_norm_spike"):
                figures[flag] = max(figures.get(flag, 0), forward.get(flag, 0))
            if "diverged_step" in forward:  # the first
                figures["diverged_step"] = forward["diverged_step"]
            forward.update(figures)
        return forward

    def _train_row(self, values: Mapping[str, Any], control: TrainerControl) -> dict[str, Any]:
        """Write one step's train row; returns the figures to forward."""
        step, tokens = values["step"], values["tokens"]
        row = {
            "kind": "train", "step": step, "epoch": finite(values["epoch"]), "loss": finite(values["loss"]),
            "grad_norm": finite(values["grad_norm"]), "lr": finite(values["lr"]), "tokens": tokens,
            "elapsed_s": round(values["elapsed_s"], 6),
        }
        source = {"loss": values["loss"], "grad_norm": values["grad_norm"]}
        rec = Record(row, source=source, logs={} if tokens is None else {"tokens": tokens})
        for probe in self.probes:
            probe.on_train_row(self.ctx, rec, control)
        self._last_train_step = step
        self.runlog.emit(rec.row, flush=rec.flush)
        return rec.logs

    # ---------------------------------------------------------------------------------------------- eval / save

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        now = time.perf_counter()
        self.ctx.clock.exclude_since_mark(now)
        self._train_rows(state, control)  # steps not logged yet (logging_strategy other than "steps") come first
        if not metrics or "eval_loss" not in metrics:
            self.ctx.warn_once("eval_loss", "OptBenchRecorder: evaluation metrics hold no 'eval_loss'; no eval row.")
            return
        row = {"kind": "eval", "step": state.global_step, "tokens": self.ctx.tokens(state),
               "elapsed_s": round(self.ctx.clock.elapsed(now), 6), "eval_loss": finite(metrics["eval_loss"])}
        rec = Record(row, source=metrics)
        for probe in self.probes:
            probe.on_eval_row(self.ctx, rec)
        self.runlog.emit(rec.row, flush=True)

    def on_save(self, args, state, control, **kwargs):
        self.ctx.clock.exclude_since_mark(time.perf_counter())
        self._train_rows(state, control)
        self.runlog.flush()

    # ---------------------------------------------------------------------------------------------- end

    def on_train_end(self, args, state, control, optimizer=None, model=None, **kwargs):
        if not self.ctx.in_train:
            return
        if self._held is not None and optimizer is not None:  # the state it holds now (8-bit dtypes, ZeRO partitions)
            from hf_optbench.optim.registry import describe_optimizer

            self._held["optimizer_impl"] = describe_optimizer(optimizer, model=model)
        self._train_rows(state, control)  # steps after the last log (a stop no log was forced for)
        self.ctx.clock.stop()  # what follows (the train-end memory walk) is not training time
        for probe in self.probes:
            for row in probe.on_train_end(self.ctx, state, optimizer, model):
                self.runlog.emit(row)
        self.runlog.flush()
        if self.runlog.writer and self.write_summary:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            summary = read_summary(self.output_dir) or {}
            if self._held is not None and model is not None:  # the Python API path: every field a run writes
                from hf_optbench.measure.provenance import trainer_summary

                summary.update(trainer_summary(args, state, model, self._held, tokens_per_step=self.tokens_per_step,
                                               data=self._data, resumed_step=self._resumed_step))
            summary.update(self.summary())
            summary["status"] = run_status(self.status)  # a Trainer that raised never gets here
            write_json_atomic(self.output_dir / SUMMARY_FILE, summary)

    def summary(self) -> dict[str, Any]:
        """Totals for summary.json (keys of docs/ARCHITECTURE.md "Contributed by the callbacks", plus details).

        No ``status`` key: the caller merges this into its own summary and decides the status (``self.status`` is
        "completed" or "diverged"; only the caller knows about exceptions). Also flushes buffered rows, so a
        caller's ``finally`` keeps them when training raised.
        """
        self.runlog.flush()
        out: dict[str, Any] = {}
        if self._held is not None:  # the Python API path: what ran, read from the objects
            held = self._held
            hp = {k: v["value"] for k, v in held["hyperparameters"].items()}
            out.update(optimizer=held["optimizer"], optimizer_impl=held["optimizer_impl"],
                       learning_rate=hp.get("learning_rate"), weight_decay=hp.get("weight_decay"),
                       hyperparameters=held["hyperparameters"], param_groups=held["param_groups"],
                       schedule=held["schedule"].get("name"), schedule_resolved=held["schedule"],
                       tokens_per_step=self.ctx.tokens_per_step)
        for probe in self.probes:
            out.update(probe.summary(self.ctx))
        return out


def _loader_sizes(train: Any, evaluation: Any) -> dict[str, Any] | None:
    """What the Trainer's data loaders held (the Python API path has no data record of its own): examples and
    batches per process of the training loader, examples of the eval loader."""
    def examples(loader: Any) -> int | None:
        try:
            return len(loader.dataset)
        except (AttributeError, TypeError):
            return None

    if train is None:
        return None
    try:
        batches = len(train)
    except TypeError:
        batches = None
    from hf_optbench.data.pipeline import described_source

    given = described_source(getattr(train, "dataset", None))  # made by prepare_data: say what it read
    if given is None:
        source = {"source": "the Trainer's train_dataset and eval_dataset (Python API)"}
    else:
        source = {"data_source": given.get("data_source"),
                  "source": f"{given.get('source')} (prepare_data, given to the Trainer)"}
    return {**source, "train_examples": examples(train),
            "train_batches_per_epoch": batches, "eval_examples": examples(evaluation) if evaluation else None}


def _log_key(key: str) -> str:
    """The ``logs`` key of a forwarded figure: ``optbench/<key>``, and ``eval_optbench/<rest>`` for an eval figure
    (``eval_<rest>``), which transformers' ``rewrite_logs`` turns into ``eval/optbench/<rest>`` for W&B, TensorBoard
    and trackio (``optbench/...`` becomes ``train/optbench/...``)."""
    if key.startswith(EVAL_PREFIX):
        return EVAL_PREFIX + LOG_PREFIX + key[len(EVAL_PREFIX):]
    return LOG_PREFIX + key


def _loggable(value: Any) -> bool:
    """A finite int/float (not a bool): what a report_to backend can plot."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and finite(value) is not None

