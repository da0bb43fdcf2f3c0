"""The benchmark's measurements as one ``transformers.TrainerCallback``: memory, time/MFU, stability, convergence.

``OptBenchRecorder`` works in hf_optbench's runs and dropped into any ``Trainer`` (single process or distributed)::

    from transformers import Trainer, TrainingArguments
    from hf_optbench.bench_config import BenchArguments
    from hf_optbench.callbacks import default_callbacks

    args = TrainingArguments("out", max_steps=200, logging_steps=1, logging_nan_inf_filter=False,
                             eval_strategy="steps", eval_steps=50, report_to="tensorboard")
    callbacks = default_callbacks(BenchArguments(target_losses=[5.0, 4.0]), "out",
                                  tokens_per_step=8 * 256)          # global: micro-batch x accum x world x block
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val, callbacks=callbacks)
    trainer.train()
    recorder = callbacks[0]
    recorder.status, recorder.diverged_step, recorder.summary()   # "completed"/"diverged", step, totals

Contract with ``run.py``: ``default_callbacks(bench_args, output_dir, *, tokens_per_step, flops_per_token=None,
resume=False)`` returns ``[OptBenchRecorder]``. The recorder owns ``output_dir/metrics.jsonl`` (rows as in
docs/ARCHITECTURE.md; written by the world-process-zero only, buffered, flushed on eval/save/stop/end and every
``metrics_flush_every`` rows; ``summary()`` also flushes, so a caller's ``finally`` keeps the rows of a crashed run)
and writes ``summary.json`` at train end by merging ``summary()`` into whatever the file holds (run.py may
rewrite it afterwards). Non-finite floats are written as ``null`` (strict JSON); the divergence step is in
``summary()["diverged_step"]``. With ``resume=True`` (or whenever the Trainer resumes at ``global_step > 0``) rows
with ``step >`` the resumed step are dropped, the rest kept, and the spike/target/timing series are replayed from
them, so the summary covers the whole run and no step appears twice.

What is measured, when, and how:

* Memory, after the first optimizer step of every ``train()`` call (state exists and is sized then, also after a
  resume) and again at train end, never per step: real storage of the optimizer state (``metrics
  .optimizer_state_bytes``: untyped storages deduplicated, tensor subclasses flattened), by dtype, state name and
  device; params and grads (grads only exist between backward and ``zero_grad``, hence after the optimizer step).
  The optimizer the Trainer hands us is unwrapped through ``.optimizer`` (Accelerate, DeepSpeed ZeRO 1-3):
  under ZeRO the innermost optimizer was built on this rank's flat fp32 partition, so its state is the partition
  this rank holds, and that partition itself is ``optimizer_master_bytes``. Totals over ranks via
  ``torch.distributed.all_gather_object`` when a process group is up.
* Peak memory: CUDA ``max_memory_allocated``/``max_memory_reserved`` after ``reset_peak_memory_stats`` at train
  begin (kind ``cuda_max_allocated``); on CPU the process's peak RSS (kind ``cpu_peak_rss``), reset at train begin
  through ``/proc/self/clear_refs`` on Linux (``peak_memory_since: "train_begin"``), else ``ru_maxrss`` since the
  process started (``"process_start"``).
* Step time: ``on_step_begin`` -> ``on_step_end`` (forward/backward of every micro-batch, clipping, optimizer and
  scheduler step, zero_grad; not data loading, eval, logging or saving), with ``torch.cuda.synchronize()`` at
  both ends on CUDA. The first ``timing_warmup_steps`` of each ``train()`` call are written as ``null`` and left
  out of the median/p90. ``tokens_per_s = tokens_per_step / median``; ``mfu = flops_per_token * tokens_per_s /
  (device peak * world size)`` with the peak from ``metrics.DEVICE_PEAK_FLOPS`` (null on CPU/unlisted devices).
  ``elapsed_s`` is wall time since train begin minus evaluation and checkpoint saving.
* Stability from the Trainer's per-step log (``logs["loss"]``, ``logs["grad_norm"]`` = total norm before
  clipping, ``logs["learning_rate"]``): the spike rule of ``metrics.SpikeDetector`` on loss and grad norm, and a
  NaN/Inf loss or grad norm stops training cleanly (``control.should_training_stop``; no eval or checkpoint of
  the broken model at that step), status "diverged". This needs ``logging_steps=1`` and
  ``logging_nan_inf_filter=False`` (with the filter on, the Trainer replaces a NaN loss by the running mean; the
  grad norm still catches it): the recorder warns once otherwise.
* Convergence: eval loss and perplexity (``exp(eval_loss)``: the Trainer's eval loss is already the mean token
  NLL over the validation split; ``evaluate``'s perplexity metric would load a Hub model and run it again);
  steps/tokens/seconds to each target loss (train: trailing mean over ``target_smoothing_steps``; eval: raw);
  trapezoid area under train loss vs tokens.

Forwarding to ``report_to`` backends: on each log event the recorder adds ``optbench/...`` keys to the ``logs``
dict the Trainer passes to every callback (W&B, TensorBoard and trackio show them as ``train/optbench/...``).
The Trainer calls the reporting callbacks before user callbacks, so the recorder moves itself in front of them
(``attach(trainer)`` does this explicitly; when passed as ``Trainer(callbacks=[...])`` it finds the
``CallbackHandler`` calling its first event, since transformers has no callback-priority API).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from . import metrics as M
from .bench_config import BenchArguments

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
LOG_PREFIX = "optbench/"
_FLUSH_SECONDS = 30.0  # an hours-long run loses at most this much of its rows to a hard kill


def default_callbacks(
    bench_args: BenchArguments,
    output_dir: str,
    *,
    tokens_per_step: int,
    flops_per_token: float | None = None,
    resume: bool = False,
) -> list[TrainerCallback]:
    """The benchmark's callbacks for one run: ``[OptBenchRecorder]`` (see the module docstring)."""
    return [
        OptBenchRecorder(
            output_dir, bench_args, tokens_per_step=tokens_per_step, flops_per_token=flops_per_token, resume=resume
        )
    ]


def _finite(x: Any) -> float | None:
    """float(x) if finite, else None (metrics.jsonl is strict JSON)."""
    if x is None:
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _calling_handler() -> Any:
    """The ``CallbackHandler`` dispatching the current event, found on the call stack (None if not found)."""
    from transformers.trainer_callback import CallbackHandler

    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, CallbackHandler):
            return owner
        frame = frame.f_back
    return None


def _place_before_reporters(handler: Any, callback: TrainerCallback) -> bool:
    """Move ``callback`` just before the first reporting integration callback; True when in place.

    Moving an element *earlier* while ``CallbackHandler.call_event`` iterates the list neither skips nor repeats
    any callback (the ones it passes over shift by one towards the position already visited).
    """
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    callbacks = handler.callbacks
    mine = next((i for i, c in enumerate(callbacks) if c is callback), None)
    if mine is None:
        return False
    reporters = tuple(INTEGRATION_TO_CALLBACK.values())
    first = next((i for i, c in enumerate(callbacks) if isinstance(c, reporters)), None)
    if first is not None and first < mine:
        callbacks.pop(mine)
        callbacks.insert(first, callback)
    return True


def _gather(obj: Any) -> list[Any]:
    """[obj of rank 0, rank 1, ...] when a process group is up, else [obj]. Every rank must call it."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out
    return [obj]


def _reset_peak_memory(device: Any) -> str:
    """Start the peak-memory window; returns since when the peak counts."""
    import torch

    if device is not None and device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return "train_begin"
    try:  # Linux: "5" resets the process's peak RSS (VmHWM) to its current RSS (proc(5), /proc/pid/clear_refs)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return "train_begin"
    except OSError:
        return "process_start"


def _read_peak_memory(device: Any) -> dict[str, Any]:
    import torch

    if device is not None and device.type == "cuda":
        return {
            "peak_memory_bytes": int(torch.cuda.max_memory_allocated(device)),
            "peak_memory_kind": "cuda_max_allocated",
            "cuda_max_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
        }
    peak = None
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if peak is None:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB on Linux
    return {"peak_memory_bytes": peak, "peak_memory_kind": "cpu_peak_rss", "cuda_max_reserved_bytes": None}


def _precision(args: Any) -> str:
    import torch

    if getattr(args, "bf16", False):
        return "bf16"
    if getattr(args, "fp16", False):
        return "fp16"
    if torch.cuda.is_available() and (
        torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
    ):
        return "tf32"
    return "fp32"


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
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        bench_args: BenchArguments | None = None,
        *,
        tokens_per_step: int | None = None,
        flops_per_token: float | None = None,
        resume: bool = False,
    ) -> None:
        self.bench = bench_args if bench_args is not None else BenchArguments()
        self.output_dir = Path(output_dir)
        self.path = self.output_dir / METRICS_FILE
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.resume = resume
        self.status = "completed"
        self.diverged_step: int | None = None
        self._placed = False
        self._writer = True
        self._warned: set[str] = set()
        self._buffer: list[str] = []
        self._last_flush = time.perf_counter()
        self._reset_series()
        # Per train() call
        self._in_train = False
        self._cuda = False
        self._device: Any = None
        self._device_name: str | None = None
        self._peak_flops: float | None = None
        self._peak_since = "process_start"
        self._steps_this_call = 0
        self._measured_this_call = False
        self._t_step = 0.0
        self._t0 = 0.0
        self._mark = 0.0
        self._excluded = 0.0
        self._elapsed_offset = 0.0
        self._pending_logs: dict[str, float] = {}
        self._step_time: tuple[int, float | None] = (-1, None)

    def _reset_series(self) -> None:
        b = self.bench
        self._loss_spikes = M.SpikeDetector(b.spike_window, b.spike_threshold, b.spike_min_history)
        self._grad_spikes = M.SpikeDetector(b.spike_window, b.spike_threshold, b.spike_min_history)
        self._train_targets = M.TargetTracker(b.target_losses, b.target_smoothing_steps)
        self._eval_targets = M.TargetTracker(b.eval_targets, 1)
        self._step_times: list[float] = []
        self._auc_x: list[float] = []
        self._auc_y: list[float] = []
        self._last_train_step = -1
        self._last_elapsed = 0.0
        self._memory: dict[str, Any] = {}
        self._memory_end: dict[str, Any] = {}

    # ---------------------------------------------------------------------------------------------- plumbing

    def attach(self, trainer: Any) -> Any:
        """Add this recorder to ``trainer`` (if needed) just before its reporting callbacks; returns ``trainer``."""
        handler = trainer.callback_handler
        if not any(c is self for c in handler.callbacks):
            handler.add_callback(self)
        self._placed = _place_before_reporters(handler, self)
        return trainer

    def _place_from_stack(self) -> None:
        if self._placed:
            return
        handler = _calling_handler()
        self._placed = handler is not None and _place_before_reporters(handler, self)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, UserWarning, stacklevel=3)

    def _emit(self, row: dict[str, Any], flush: bool = False) -> None:
        if self._writer:
            self._buffer.append(json.dumps(row, allow_nan=False))
        if flush or len(self._buffer) >= self.bench.metrics_flush_every or (
            time.perf_counter() - self._last_flush > _FLUSH_SECONDS
        ):
            self.flush()

    def flush(self) -> None:
        """Append buffered rows to metrics.jsonl (world process zero only; no fsync)."""
        self._last_flush = time.perf_counter()
        if not self._buffer or not self._writer:
            self._buffer.clear()
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("\n".join(self._buffer) + "\n")
        self._buffer.clear()

    def _sync(self) -> None:
        if self._cuda:
            import torch

            torch.cuda.synchronize(self._device)

    def _tokens(self, state: Any) -> int | None:
        if self.tokens_per_step is not None:
            return int(state.global_step * self.tokens_per_step)
        seen = getattr(state, "num_input_tokens_seen", 0)
        return int(seen) if seen else None

    def _elapsed(self, now: float | None = None) -> float:
        if not self._in_train:
            return self._last_elapsed
        now = time.perf_counter() if now is None else now
        return self._elapsed_offset + (now - self._t0 - self._excluded)

    # ---------------------------------------------------------------------------------------------- train begin

    def on_init_end(self, args, state, control, **kwargs):
        self._place_from_stack()

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._place_from_stack()
        if not self._placed and [r for r in (args.report_to or []) if r != "none"]:
            self._warn_once(
                "placement",
                "OptBenchRecorder could not place itself before the report_to callbacks: optbench/ figures will not "
                "reach them. Use recorder.attach(trainer) instead of Trainer(callbacks=[...]).",
            )
        self._writer = bool(state.is_world_process_zero)
        if args.logging_strategy != "steps" or args.logging_steps != 1:
            self._warn_once(
                "logging_steps",
                f"OptBenchRecorder needs logging_strategy='steps' and logging_steps=1 to see every step's loss and "
                f"grad norm (got {args.logging_strategy}, {args.logging_steps}): per-step rows, spikes and divergence "
                "checks only cover logged steps. Set logging_steps=1.",
            )
        if args.logging_nan_inf_filter:
            self._warn_once(
                "nan_filter",
                "logging_nan_inf_filter=True makes the Trainer replace a NaN/Inf loss by the running mean, so divergence "
                "is only caught through the gradient norm. Set logging_nan_inf_filter=False.",
            )
        if self.tokens_per_step is None and args.include_num_input_tokens_seen in (None, "no", False):
            self._warn_once(
                "tokens",
                "OptBenchRecorder got no tokens_per_step and the Trainer does not count input tokens: tokens, "
                "tokens/s, MFU and the loss-vs-tokens AUC will be null. Pass tokens_per_step.",
            )
        self._device = args.device
        self._cuda = self._device is not None and self._device.type == "cuda"
        self._setup_peak_flops(args, model)
        resume = self.resume or state.global_step > 0
        self._reset_series()
        self._buffer.clear()
        if resume:
            self._restore(state.global_step)
        elif self._writer and self.path.exists():
            self.path.unlink()  # a fresh run: a previous run's rows would duplicate steps
        self._peak_since = _reset_peak_memory(self._device)
        self._steps_this_call = 0
        self._measured_this_call = False
        self._pending_logs = {}
        self._excluded = 0.0
        self._elapsed_offset = self._last_elapsed
        self._in_train = True
        self._sync()
        self._t0 = self._mark = time.perf_counter()

    def _setup_peak_flops(self, args: Any, model: Any) -> None:
        import torch

        self._device_name = torch.cuda.get_device_name(self._device) if self._cuda else None
        self._precision = _precision(args)
        if self.bench.device_peak_tflops is not None:
            self._peak_flops = self.bench.device_peak_tflops * 1e12
        else:
            self._peak_flops = M.device_peak_flops(self._device_name, self._precision)
        self._world_size = int(getattr(args, "world_size", 1) or 1)
        config = getattr(model, "config", None)
        if self.flops_per_token is None and self.tokens_per_step and getattr(config, "model_type", None) == "gpt2":
            per_step_seqs = args.per_device_train_batch_size * args.gradient_accumulation_steps * self._world_size
            if per_step_seqs > 0 and self.tokens_per_step % per_step_seqs == 0:
                self.flops_per_token = M.flops_per_token(config, self.tokens_per_step // per_step_seqs)

    def _restore(self, global_step: int) -> None:
        """Keep rows with step <= global_step, rewrite the file, and replay the series from them."""
        kept: list[dict[str, Any]] = []
        if self.path.exists():
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:  # a line cut by a kill mid-write
                        continue
                    if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= global_step:
                        kept.append(row)
        if self._writer and self.path.exists():
            tmp = self.path.with_suffix(".jsonl.tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r, allow_nan=False) + "\n" for r in kept)
            os.replace(tmp, self.path)
        for row in kept:
            kind = row.get("kind")
            if kind == "train":
                self._observe_train(row["step"], row.get("loss"), row.get("grad_norm"), row.get("tokens"),
                                    row.get("elapsed_s"))
                if row.get("step_time_s") is not None:
                    self._step_times.append(float(row["step_time_s"]))
                self._last_train_step = row["step"]
            elif kind == "eval":
                self._eval_targets.update(row.get("eval_loss"), row["step"], row.get("tokens"), row.get("elapsed_s"))
            elif kind == "memory":
                self._memory = {k: v for k, v in row.items() if k not in ("kind", "when")}
            if row.get("elapsed_s") is not None:
                self._last_elapsed = max(self._last_elapsed, float(row["elapsed_s"]))

    def _observe_train(self, step: int, loss: Any, grad_norm: Any, tokens: int | None, elapsed: float | None):
        loss, grad_norm = _finite(loss), _finite(grad_norm)
        loss_spike = self._loss_spikes.update(loss, step) is not None
        grad_spike = self._grad_spikes.update(grad_norm, step) is not None
        self._train_targets.update(loss, step, tokens, elapsed)
        if loss is not None and tokens is not None:
            self._auc_x.append(float(tokens))
            self._auc_y.append(loss)
        return loss_spike, grad_spike

    # ---------------------------------------------------------------------------------------------- per step

    def on_step_begin(self, args, state, control, **kwargs):
        self._sync()
        self._t_step = time.perf_counter()

    def on_optimizer_step(self, args, state, control, optimizer=None, model=None, **kwargs):
        if self.bench.measure_memory and not self._measured_this_call and optimizer is not None:
            self._measured_this_call = True
            t = time.perf_counter()
            row = self._measure_memory(optimizer, model, state.global_step + 1, "first_step", grads=True)
            self._memory = row
            self._emit({"kind": "memory", **row})
            for key in ("optimizer_state_bytes", "optimizer_state_bytes_total", "optimizer_state_bytes_per_param",
                        "param_bytes", "grad_bytes"):
                if row.get(key) is not None:
                    self._pending_logs[LOG_PREFIX + key] = row[key]
            spent = time.perf_counter() - t  # a one-off walk (and all-gather): neither step time nor training time
            self._t_step += spent
            self._excluded += spent

    def on_step_end(self, args, state, control, **kwargs):
        self._sync()
        now = time.perf_counter()
        self._steps_this_call += 1
        duration: float | None = now - self._t_step
        if self._steps_this_call <= self.bench.timing_warmup_steps:
            duration = None
        else:
            self._step_times.append(duration)
        self._step_time = (state.global_step, duration)
        self._mark = now

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        if "loss" in logs and state.global_step > self._last_train_step:
            self._train_row(state, control, logs)
        elif "eval_loss" in logs:
            ppl = self._perplexity(logs["eval_loss"])
            if ppl is not None:
                logs[LOG_PREFIX + "eval_perplexity"] = ppl
        if "train_runtime" in logs:  # the Trainer's final log of a train() call
            for key, value in self._totals().items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and _finite(value) is not None:
                    logs[LOG_PREFIX + key] = value
        if self._pending_logs:
            logs.update(self._pending_logs)
            self._pending_logs = {}
        if self._in_train:
            self._mark = time.perf_counter()

    def _train_row(self, state, control, logs) -> None:
        step = state.global_step
        tokens = self._tokens(state)
        elapsed = self._elapsed()
        loss, grad_norm = logs.get("loss"), logs.get("grad_norm")
        loss_spike, grad_spike = self._observe_train(step, loss, grad_norm, tokens, elapsed)
        step_time = self._step_time[1] if self._step_time[0] == step else None
        self._last_train_step = step
        self._last_elapsed = elapsed
        row = {
            "kind": "train", "step": step, "epoch": _finite(state.epoch), "loss": _finite(loss),
            "grad_norm": _finite(grad_norm), "lr": _finite(logs.get("learning_rate")), "tokens": tokens,
            "elapsed_s": round(elapsed, 6), "step_time_s": None if step_time is None else round(step_time, 6),
            "loss_spike": loss_spike, "grad_norm_spike": grad_spike,
        }
        logs[LOG_PREFIX + "loss_spike"] = int(loss_spike)
        logs[LOG_PREFIX + "grad_norm_spike"] = int(grad_spike)
        if tokens is not None:
            logs[LOG_PREFIX + "tokens"] = tokens
        if step_time is not None:
            logs[LOG_PREFIX + "step_time_s"] = step_time
        nonfinite = _nonfinite(loss) or _nonfinite(grad_norm)
        if nonfinite and self.diverged_step is None:
            self.status, self.diverged_step = "diverged", step
            logs[LOG_PREFIX + "diverged_step"] = step
            if self.bench.stop_on_divergence:
                control.should_training_stop = True
                control.should_evaluate = False  # evaluating or checkpointing a NaN model only costs time
                control.should_save = False
        self._emit(row, flush=nonfinite)

    @staticmethod
    def _perplexity(loss: Any) -> float | None:
        loss = _finite(loss)
        if loss is None:
            return None
        try:
            return _finite(math.exp(loss))
        except OverflowError:
            return None

    # ---------------------------------------------------------------------------------------------- eval / save

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        now = time.perf_counter()
        if self._in_train:
            self._excluded += now - self._mark
            self._mark = now
        if not metrics or "eval_loss" not in metrics:
            self._warn_once("eval_loss", "OptBenchRecorder: evaluation metrics hold no 'eval_loss'; no eval row.")
            return
        loss = metrics["eval_loss"]
        tokens, elapsed = self._tokens(state), self._elapsed(now)
        self._eval_targets.update(_finite(loss), state.global_step, tokens, elapsed)
        self._emit(
            {"kind": "eval", "step": state.global_step, "tokens": tokens, "elapsed_s": round(elapsed, 6),
             "eval_loss": _finite(loss), "eval_perplexity": self._perplexity(loss)},
            flush=True,
        )

    def on_save(self, args, state, control, **kwargs):
        now = time.perf_counter()
        if self._in_train:
            self._excluded += now - self._mark
            self._mark = now
        self.flush()

    # ---------------------------------------------------------------------------------------------- end

    def on_train_end(self, args, state, control, optimizer=None, model=None, **kwargs):
        if not self._in_train:
            return
        self._last_elapsed = self._elapsed()
        self._in_train = False
        if self.bench.measure_memory and optimizer is not None:
            row = self._measure_memory(optimizer, model, state.global_step, "train_end", grads=False)
            self._memory_end = row
            self._emit({"kind": "memory", **row})
        self.flush()
        if self._writer:
            self._write_summary()

    def _measure_memory(self, optimizer: Any, model: Any, step: int, when: str, grads: bool) -> dict[str, Any]:
        params = list(model.parameters()) if model is not None else []
        state = M.optimizer_state_bytes(optimizer, params)
        num_params = M.count_unique_params(params)
        local: dict[str, Any] = {
            "state": state.total,
            "params": _param_bytes(params),
            "grads": M.grads_storage_bytes(params) if grads else None,
        }
        if when == "train_end":
            local.update(_read_peak_memory(self._device))
        ranks = _gather(local)
        row: dict[str, Any] = {
            "step": step,
            "when": when,
            "optimizer_state_bytes": state.total,
            "optimizer_state_bytes_total": sum(r["state"] for r in ranks),
            "optimizer_state_bytes_per_param": state.total / num_params if num_params else None,
            "optimizer_state_bytes_by_dtype": state.by_dtype,
            "optimizer_state_bytes_by_name": state.by_name,
            "optimizer_state_bytes_by_device": state.by_device,
            "optimizer_state_tensors": state.num_tensors,
            "optimizer_master_bytes": state.master_bytes,
            "param_bytes": local["params"],
            "num_params": num_params,
            "world_size": len(ranks),
        }
        if grads:
            row["grad_bytes"] = local["grads"]
        if when == "train_end":
            row.update({k: local[k] for k in ("peak_memory_bytes", "peak_memory_kind", "cuda_max_reserved_bytes")})
            row["peak_memory_since"] = self._peak_since
            row["peak_memory_bytes_per_rank"] = [r["peak_memory_bytes"] for r in ranks]
        return row

    def _write_summary(self) -> None:
        path = self.output_dir / SUMMARY_FILE
        summary: dict[str, Any] = {}
        if path.exists():
            try:
                summary = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                summary = {}
        summary.update(self.summary())
        summary["status"] = self.status  # run.py decides the final status itself (it also knows "failed")
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(summary, indent=2, allow_nan=False, default=str), encoding="utf-8")
        os.replace(tmp, path)

    # ---------------------------------------------------------------------------------------------- summary

    def _totals(self) -> dict[str, Any]:
        median, p90 = M.median_and_p90(self._step_times)
        tokens_per_s = self.tokens_per_step / median if (median and self.tokens_per_step) else None
        largest_loss, largest_grad = self._loss_spikes.largest, self._grad_spikes.largest
        peak = _read_peak_memory(self._device) if self._in_train else {}
        return {
            "step_time_median_s": median,
            "step_time_p90_s": p90,
            "timed_steps": len(self._step_times),
            "tokens_per_s": tokens_per_s,
            "mfu": M.model_flops_utilization(self.flops_per_token, tokens_per_s, self._peak_flops,
                                             getattr(self, "_world_size", 1)),
            "loss_spikes": self._loss_spikes.count,
            "max_loss_spike": largest_loss.z if largest_loss else None,
            "grad_norm_spikes": self._grad_spikes.count,
            "max_grad_norm_spike": largest_grad.z if largest_grad else None,
            "peak_memory_bytes": peak.get("peak_memory_bytes"),
        }

    def summary(self) -> dict[str, Any]:
        """Totals for summary.json (keys of docs/ARCHITECTURE.md "Contributed by the callbacks", plus details).

        No ``status`` key: the caller merges this into its own summary and decides the status (``self.status`` is
        "completed" or "diverged"; only the caller knows about exceptions). Also flushes buffered rows, so a
        caller's ``finally`` keeps them when training raised.
        """
        self.flush()
        totals = self._totals()
        mem = {**self._memory, **{k: v for k, v in self._memory_end.items() if v is not None}}
        peak = {k: mem.get(k) for k in ("peak_memory_bytes", "peak_memory_kind", "cuda_max_reserved_bytes",
                                          "peak_memory_since", "peak_memory_bytes_per_rank")}
        if peak["peak_memory_bytes"] is None and self._in_train:
            peak.update(_read_peak_memory(self._device), peak_memory_since=self._peak_since)
        largest_loss, largest_grad = self._loss_spikes.largest, self._grad_spikes.largest
        return {
            "diverged_step": self.diverged_step,
            "optimizer_state_bytes": mem.get("optimizer_state_bytes"),
            "optimizer_state_bytes_total": mem.get("optimizer_state_bytes_total"),
            "optimizer_state_bytes_per_param": mem.get("optimizer_state_bytes_per_param"),
            "optimizer_state_bytes_by_dtype": mem.get("optimizer_state_bytes_by_dtype"),
            "optimizer_state_bytes_by_name": mem.get("optimizer_state_bytes_by_name"),
            "optimizer_state_bytes_by_device": mem.get("optimizer_state_bytes_by_device"),
            "optimizer_master_bytes": mem.get("optimizer_master_bytes"),
            "param_bytes": mem.get("param_bytes"),
            "grad_bytes": self._memory.get("grad_bytes"),
            **peak,
            "step_time_median_s": totals["step_time_median_s"],
            "step_time_p90_s": totals["step_time_p90_s"],
            "timed_steps": totals["timed_steps"],
            "timing_warmup_steps": self.bench.timing_warmup_steps,
            "tokens_per_s": totals["tokens_per_s"],
            "flops_per_token": self.flops_per_token,
            "device_name": self._device_name,
            "precision": getattr(self, "_precision", None),
            "device_peak_flops": self._peak_flops,
            "mfu": totals["mfu"],
            "loss_spikes": totals["loss_spikes"],
            "max_loss_spike": totals["max_loss_spike"],
            "max_loss_spike_step": largest_loss.index if largest_loss else None,
            "grad_norm_spikes": totals["grad_norm_spikes"],
            "max_grad_norm_spike": totals["max_grad_norm_spike"],
            "max_grad_norm_spike_step": largest_grad.index if largest_grad else None,
            "spike_rule": {"window": self.bench.spike_window, "threshold": self.bench.spike_threshold,
                           "min_history": self.bench.spike_min_history},
            "targets": {"train": self._train_targets.as_dict(), "eval": self._eval_targets.as_dict()},
            "target_smoothing_steps": self.bench.target_smoothing_steps,
            "loss_auc_tokens": M.trapezoid_auc(self._auc_x, self._auc_y),
        }


def _nonfinite(x: Any) -> bool:
    if x is None:
        return False
    try:
        return not math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _param_bytes(params: list[Any]) -> int:
    """Storage of the model's parameters on this rank; ZeRO-3 keeps each one's partition in ``ds_tensor``."""
    return M.params_storage_bytes(getattr(p, "ds_tensor", p) for p in params)
