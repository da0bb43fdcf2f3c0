"""The progress a single run prints: step, tokens/s and ETA, a rewritten line on a terminal, plain lines in logs."""

from __future__ import annotations

import io

from hf_optbench.run.console import ProgressLine, format_eta


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_eta_reads_like_tqdm() -> None:
    assert (format_eta(5), format_eta(125), format_eta(3723)) == ("0:05", "2:05", "1:02:03")


def test_plain_lines_every_tenth_of_the_run_with_rate_and_eta() -> None:
    clock, out = Clock(), io.StringIO()
    progress = ProgressLine(100, tokens_per_step=1024, stream=out, live=False, clock=clock)
    progress.start(0)
    for step in range(1, 101):
        clock.t += 0.5  # 2 steps/s = 2,048 tok/s
        progress.on_step(step)
        progress.on_log(step, {"loss": 5.0, "learning_rate": 1e-3})
    progress.end()
    lines = out.getvalue().splitlines()
    assert len(lines) == 11 and "\r" not in out.getvalue()  # step 1, then every 10 steps
    assert lines[1] == "[step 10/100] 2,048 tok/s ETA 0:45 loss 5.0000 lr 0.001"
    assert lines[-1].startswith("[step 100/100] 2,048 tok/s ETA 0:00")


def test_a_resumed_run_rates_only_its_own_steps() -> None:
    clock, out = Clock(), io.StringIO()
    progress = ProgressLine(100, stream=out, live=False, clock=clock)
    progress.start(60)  # resumed at step 60: the 60 steps before took no time in this process
    clock.t += 10.0
    progress.on_log(70, {"loss": 4.0})
    assert "[step 70/100] 1.00 it/s ETA 0:30" in out.getvalue()


def test_on_a_terminal_one_line_is_rewritten_and_evals_are_kept() -> None:
    clock, out = Clock(), io.StringIO()
    progress = ProgressLine(4, tokens_per_step=10, stream=out, live=True, clock=clock)
    progress.start(0)
    for step in (1, 2):
        clock.t += 1.0
        progress.on_step(step)
    progress.on_log(2, {"eval_loss": 3.25})
    clock.t += 1.0
    progress.on_step(4)
    progress.end()
    text = out.getvalue()
    assert text.startswith("\r[step 1/4] 10 tok/s ETA 0:03\r[step 2/4] 10 tok/s ETA 0:02\n")
    assert "[step 2/4] 10 tok/s ETA 0:02 eval_loss 3.2500\n" in text
    assert text.endswith("\r[step 4/4] 13 tok/s ETA 0:00\n")


def test_with_a_loss_log_every_few_steps_a_line_comes_at_the_first_log_past_each_tenth() -> None:
    clock, out = Clock(), io.StringIO()
    progress = ProgressLine(100, stream=out, live=False, clock=clock)
    progress.start(0)
    for step in range(1, 101):
        clock.t += 1.0
        if step % 3 == 0 or step == 100:  # logging_steps 3, and the forced log at the last step
            progress.on_log(step, {"loss": 4.0})
    steps = [int(line.split("/")[0].removeprefix("[step ")) for line in out.getvalue().splitlines()]
    assert steps == [12, 21, 30, 42, 51, 60, 72, 81, 90, 100]
