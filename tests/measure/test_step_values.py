"""measure/step_values.py through the recorder: every step's row, read from the device only at the Trainer's loss
logs, holds what a log at that step would have shown; no host sync happens between logs (issue 42)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator

from hf_optbench.config.bench_args import BenchArguments
from hf_optbench.measure.probe_base import RunContext
from hf_optbench.measure.recorder import attach_callbacks, default_callbacks

from fixtures.models import tiny_model, token_data

SEQ, BATCH = 32, 4
COMPARED = ("step", "epoch", "loss", "grad_norm", "lr", "tokens")


class LossLogs(TrainerCallback):
    """The Trainer's own train logs, as a report_to backend receives them."""

    def __init__(self) -> None:
        self.logs: dict[int, dict] = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.logs[state.global_step] = dict(logs)


def _run(out: Path, logging_steps: int, *, accumulation: int = 1, max_steps: int = 11, attach: bool = True,
         callbacks: tuple = (), **overrides) -> tuple[list[dict], LossLogs, object]:
    kw = dict(max_steps=max_steps, per_device_train_batch_size=BATCH, use_cpu=True, report_to="none",
              logging_steps=logging_steps, logging_nan_inf_filter=False, gradient_accumulation_steps=accumulation,
              save_strategy="no", disable_tqdm=True, seed=0, learning_rate=1e-3, lr_scheduler_type="cosine",
              warmup_steps=2)
    args = TrainingArguments(str(out), **{**kw, **overrides})
    ours = default_callbacks(BenchArguments(timing_warmup_steps=1), str(out), tokens_per_step=BATCH * SEQ)
    spy = LossLogs()
    trainer = Trainer(model=tiny_model(), args=args, train_dataset=token_data(96), eval_dataset=token_data(8, seed=1),
                      data_collator=default_data_collator, callbacks=[*callbacks, spy] + ([] if attach else ours))
    if attach:
        attach_callbacks(trainer, ours)
    trainer.train()
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines], spy, ours[0]


def _train(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["kind"] == "train"]


@pytest.mark.parametrize("accumulation", [1, 2])
def test_rows_read_every_n_steps_equal_the_logs_of_every_step(tmp_path: Path, accumulation: int) -> None:
    every_step, logs, _ = _run(tmp_path / "a", 1, accumulation=accumulation)
    every_four, logs4, _ = _run(tmp_path / "b", 4, accumulation=accumulation)
    assert [r["step"] for r in _train(every_four)] == list(range(1, 12))
    # what the Trainer logs at every step is exactly what the rows read from the device every 4th step hold
    for row in _train(every_four):
        log = logs.logs[row["step"]]
        assert (row["loss"], row["grad_norm"], row["lr"]) == (log["loss"], log["grad_norm"], log["learning_rate"])
    assert [{k: r[k] for k in COMPARED} for r in _train(every_four)] == \
        [{k: r[k] for k in COMPARED} for r in _train(every_step)]
    # the Trainer logged at 4, 8 and, forced by the recorder before it stopped, 11 (a 3-step mean there)
    assert sorted(logs4.logs) == [4, 8, 11]
    window = [logs.logs[s]["loss"] for s in (9, 10, 11)]
    assert logs4.logs[11]["loss"] == pytest.approx(sum(window) / 3, rel=1e-6)
    elapsed = [r["elapsed_s"] for r in _train(every_four)]
    assert elapsed == sorted(elapsed) and len(set(elapsed)) == len(elapsed)
    times = [r["step_time_s"] for r in _train(every_four)]
    assert times[0] is None and all(t > 0 for t in times[1:])


def test_a_divergence_between_logs_is_recorded_at_its_step_and_stops_at_the_next_log(tmp_path: Path) -> None:
    class NaNAtStep(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            if state.global_step == 5:  # step 6's loss is NaN
                with torch.no_grad():
                    for p in model.parameters():
                        p.fill_(float("nan"))

    rows, logs, recorder = _run(tmp_path, 4, max_steps=20, callbacks=(NaNAtStep(),), eval_strategy="steps",
                                eval_steps=10)
    assert recorder.status == "diverged" and recorder.diverged_step == 6
    assert [r["step"] for r in _train(rows)] == list(range(1, 9))  # read, and stopped, at the log of step 8
    assert [r["loss"] is None for r in _train(rows)] == [False] * 5 + [True] * 3
    assert not [r for r in rows if r["kind"] == "eval"]


def test_rows_are_read_before_each_evaluation_and_save(tmp_path: Path) -> None:
    rows, logs, _ = _run(tmp_path, 5, max_steps=8, eval_strategy="steps", eval_steps=3, save_strategy="steps",
                         save_steps=4)
    kinds = [(r["kind"], r["step"]) for r in rows if r["kind"] in ("train", "eval")]
    for kind, step in kinds:
        if kind == "eval":  # every train row up to the evaluated step is written before the eval row
            assert [s for k, s in kinds[:kinds.index((kind, step))] if k == "train"] == list(range(1, step + 1))
    assert sorted(logs.logs) == [3, 4, 5, 6, 8]  # logs at 5 (logging_steps) and before each eval, save and the end


def test_a_recorder_given_to_the_constructor_is_watched_too(tmp_path: Path) -> None:
    rows, _, recorder = _run(tmp_path, 4, attach=False)  # Trainer(callbacks=[recorder]): it finds its Trainer
    assert [r["step"] for r in _train(rows)] == list(range(1, 12)) and recorder.steps.watched


def test_an_unwatched_recorder_writes_the_logged_steps_only(tmp_path: Path) -> None:
    """Added after the Trainer's init (``add_callback``): no init event finds the Trainer, so it says how."""
    args = TrainingArguments(str(tmp_path), max_steps=8, per_device_train_batch_size=BATCH, use_cpu=True,
                             report_to="none", logging_steps=4, save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=tiny_model(), args=args, train_dataset=token_data(96), data_collator=default_data_collator)
    trainer.add_callback(default_callbacks(BenchArguments(), str(tmp_path), tokens_per_step=BATCH * SEQ)[0])
    with pytest.warns(UserWarning, match="attach_callbacks"):
        trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in _train(rows)] == [4, 8]


class _FakeEvent:
    """torch.cuda.Event on a CPU: records the host time (its waits are counted by ``count_syncs``)."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def query(self) -> bool:  # done once the stream was waited for (here: always, the host ran it)
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _FakeEvent) -> float:
        return (end.t - self.t) * 1e3


def count_syncs(tmp_path: Path, monkeypatch, logging_steps: int, max_steps: int = 12, cuda: bool = False) -> dict:
    """Every host sync of a recorded run, by where it happened: ``Tensor.item``/``tolist`` (a device-to-host copy
    on a GPU), ``torch.cuda.synchronize`` and ``Event.synchronize``. Without ``cuda`` the recorder's CUDA path runs
    on the CPU: its context reports CUDA, and the events are fakes that count their waits. Torch's own internals
    are left out (on a GPU their scalars, such as the optimizer's step counter, live on the CPU)."""
    import traceback

    waits: list[tuple[str, str]] = []
    where = {"at": "setup"}

    def counted(name, real=None):
        def call(*args, **kwargs):
            caller = traceback.extract_stack(limit=2)[0].filename
            if "/torch/" not in caller:
                waits.append((where["at"], name))
            return real(*args, **kwargs) if real is not None else None
        return call

    class Where(TrainerCallback):  # first in line: which part of the loop a wait falls into
        def on_step_begin(self, args, state, control, **kwargs):
            where["at"] = f"in step {state.global_step + 1}"

        def on_step_end(self, args, state, control, **kwargs):
            where["at"] = f"after step {state.global_step}"

    if cuda:
        monkeypatch.setattr(torch.cuda, "synchronize", counted("cuda.synchronize", torch.cuda.synchronize))
        monkeypatch.setattr(torch.cuda.Event, "synchronize",
                            counted("Event.synchronize", torch.cuda.Event.synchronize))
    else:
        monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
        monkeypatch.setattr(torch.cuda, "synchronize", counted("cuda.synchronize"))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake")
        monkeypatch.setattr(RunContext, "cuda", property(lambda self: True))
        monkeypatch.setattr(_FakeEvent, "synchronize",
                            lambda self: waits.append((where["at"], "Event.synchronize")))
    monkeypatch.setattr(torch.Tensor, "item", counted("item", torch.Tensor.item))
    monkeypatch.setattr(torch.Tensor, "tolist", counted("tolist", torch.Tensor.tolist))
    _run(tmp_path, logging_steps, max_steps=max_steps, callbacks=(Where(),), use_cpu=not cuda)
    per_place: dict[str, int] = {}
    for at, _name in waits:
        per_place[at] = per_place.get(at, 0) + 1
    return per_place


@pytest.mark.parametrize("logging_steps", [1, 4])
def test_no_host_sync_between_the_trainers_loss_logs(tmp_path: Path, monkeypatch, logging_steps: int) -> None:
    """The sync figure of issue 42: the waits of a whole run, by place; none inside a step, none after a step that
    does not log; at a log, the Trainer's two (loss and grad norm) and the recorder's one read (its CUDA events are
    done by then: no wait). Before, every step had 4: two ``torch.cuda.synchronize`` around it and the Trainer's
    two at its log (logging_steps 1)."""
    per_place = count_syncs(tmp_path, monkeypatch, logging_steps)
    assert not [at for at in per_place if at.startswith("in step")]
    logged = {f"after step {s}" for s in range(1, 13) if s % logging_steps == 0 or s == 12}
    after = {at for at in per_place if at.startswith("after step")}
    assert after == logged
    # 2 Trainer .item() and the recorder's 1 read; at the end also the Trainer's total
    assert all(per_place[at] == (4 if at == "after step 12" else 3) for at in logged), per_place


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_no_host_sync_between_the_trainers_loss_logs(tmp_path: Path, monkeypatch) -> None:
    per_place = count_syncs(tmp_path, monkeypatch, 4, cuda=True)
    assert not [at for at in per_place if at.startswith("in step")]
    assert {at for at in per_place if at.startswith("after step")} == {"after step 4", "after step 8", "after step 12"}


def test_attaching_twice_watches_the_trainer_once(tmp_path: Path) -> None:
    args = TrainingArguments(str(tmp_path), max_steps=2, per_device_train_batch_size=BATCH, use_cpu=True,
                             report_to="none", save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=tiny_model(), args=args, train_dataset=token_data(16),
                      data_collator=default_data_collator)
    ours = default_callbacks(BenchArguments(), str(tmp_path), tokens_per_step=BATCH * SEQ)
    attach_callbacks(trainer, ours)
    wrapped = trainer.training_step
    attach_callbacks(trainer, ours)  # e.g. again after adding a reporting callback
    assert trainer.training_step is wrapped and ours[0].steps.watched
    trainer.train()
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
            if '"train"' in line] == [1, 2]
