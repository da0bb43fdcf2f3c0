"""What a run prints while it trains: progress a user recognises (step, tokens/s, ETA), not transformers' dict per
logged step.

On a terminal one line is rewritten in place after each step (as tqdm does); in a log file (a sweep's stdout.log,
CI) a plain line every ~10 % of the run (at the first loss log past each mark: the Trainer logs every
``logging_steps``; its loss there is the mean over the steps since its last log). Both show the rate over this process's steps so far: a resumed run's ETA
is not skewed by steps an earlier process took.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def format_eta(seconds: float) -> str:
    """``1:02:03`` / ``2:03``: the form tqdm prints."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressLine:
    """Step, rate and ETA since ``start`` (framework-free, so the Trainer callback below is a thin shell)."""

    def __init__(self, max_steps: int, tokens_per_step: int | None = None, *, stream: TextIO | None = None,
                 live: bool | None = None, clock: Any = time.perf_counter) -> None:
        self.max_steps = max_steps
        self.tokens_per_step = tokens_per_step
        self.stream = stream if stream is not None else sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self.every = max(1, max_steps // 10)
        self.clock = clock
        self.t0: float | None = None
        self.step0 = 0
        self._last_live = 0.0
        self._pending = False  # a live line is on screen without its newline
        self._mark = 0

    def start(self, step: int) -> None:
        self.t0, self.step0 = self.clock(), step
        self._mark = step // self.every  # the ~10 % marks passed: a line at the first loss log past each next one

    def rate(self, step: int) -> tuple[float | None, float | None]:
        """(steps/s, seconds left) over this process's steps, or (None, None) before the first one."""
        if self.t0 is None or step <= self.step0:
            return None, None
        per_s = (step - self.step0) / max(self.clock() - self.t0, 1e-9)
        return per_s, (self.max_steps - step) / per_s

    def status(self, step: int) -> str:
        per_s, left = self.rate(step)
        text = f"[step {step}/{self.max_steps}]"
        if per_s is not None:
            speed = f"{per_s * self.tokens_per_step:,.0f} tok/s" if self.tokens_per_step else f"{per_s:.2f} it/s"
            text += f" {speed} ETA {format_eta(left)}"
        return text

    def line(self, text: str) -> None:
        """A permanent line (ends a live line first)."""
        if self._pending:
            self.stream.write("\n")
            self._pending = False
        self.stream.write(text + "\n")
        self.stream.flush()

    def on_step(self, step: int) -> None:
        """On a terminal, rewrite the status line (at most every 0.2 s, and at the last step)."""
        if not self.live:
            return
        now = self.clock()
        if now - self._last_live < 0.2 and step < self.max_steps:
            return
        self._last_live = now
        self.stream.write("\r" + self.status(step))
        self.stream.flush()
        self._pending = True

    def on_log(self, step: int, logs: dict[str, Any]) -> None:
        if "eval_loss" in logs:
            self.line(f"{self.status(step)} eval_loss {logs['eval_loss']:.4f}")
        elif "loss" in logs and (step // self.every > self._mark or step == 1):
            self._mark = step // self.every
            grad = logs.get("grad_norm")
            grad_s = f" grad_norm {grad:.3g}" if isinstance(grad, int | float) else ""
            self.line(f"{self.status(step)} loss {logs['loss']:.4f} lr {logs.get('learning_rate', 0):.3g}{grad_s}")

    def end(self) -> None:
        if self._pending:
            self.stream.write("\n")
            self.stream.flush()
            self._pending = False


class ConsoleProgress:
    """The Trainer callback that drives :class:`ProgressLine` on the main process; replaces transformers'
    PrinterCallback/ProgressCallback (which print a dict at every log)."""

    def __new__(cls, max_steps: int, tokens_per_step: int | None = None):  # transformers imported lazily
        from transformers import TrainerCallback

        class _ConsoleProgress(TrainerCallback):
            def __init__(self) -> None:
                self.progress = ProgressLine(max_steps, tokens_per_step)

            def on_train_begin(self, args, state, control, **kwargs):
                self.progress.start(state.global_step)  # after a resume: the step it resumed at

            def on_step_end(self, args, state, control, **kwargs):
                if state.is_world_process_zero:
                    self.progress.on_step(state.global_step)

            def on_log(self, args, state, control, logs=None, **kwargs):
                if state.is_world_process_zero and logs:
                    self.progress.on_log(state.global_step, logs)

            def on_train_end(self, args, state, control, **kwargs):
                if state.is_world_process_zero:
                    self.progress.end()

        return _ConsoleProgress()
