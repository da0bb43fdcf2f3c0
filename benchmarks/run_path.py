"""The two loops the overhead benchmarks compare, built once here so that each script times the same thing:

* :func:`project_trainer`: what ``hf-optbench run`` trains with, assembled by the run's own code
  (``config.parse.parse_args`` -> ``run.plan.resolve_plan`` -> ``run.train.build_optimization`` -> ``run.train.
  assemble``: TrainingArguments rendered from the plan, every callback of a run in its order, the model and the
  optimizer as a run builds them), over data handed in (in memory, or the run's own prepared splits);
* :func:`plain_loop`: nanoGPT's training loop (karpathy/nanoGPT ``train.py`` at commit e2221318): the next batch
  fetched right after the forward (on a GPU it is copied while the forward's kernels run), backward, clipping,
  optimizer and scheduler step, ``zero_grad(set_to_none=True)``, and the loss read (the loop's only host sync)
  every ``log_interval`` steps.

Both time a step the same way: the wall time between two consecutive syncs (the plain loop's ``loss.item()``, the
Trainer's loss log), divided by the steps between them, so that neither side pays a sync the other does not.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import TrainerCallback, default_data_collator  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEMO_SWEEP = ROOT / "recipes" / "sweeps" / "cpu_demo.yaml"
# What every timing here reads: wall time, or with --clock cpu this process's CPU time, which other processes on a
# shared machine do not add to (on one thread and a CPU device, the work of a step; meaningless on a GPU)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]


def use_clock(name: str) -> None:
    """Time with ``CLOCKS[name]`` from now on (every benchmark script's ``--clock``)."""
    global clock
    clock = CLOCKS[name]


def run_args(size: str, batch: int, block: int, vocab: int, steps: int, logging_steps: int, out: str, *,
             device: str = "cpu", bf16: bool = False, compile_: bool = False, pad: int = 64,
             compile_backend: str = "inductor") -> list[str]:
    """``hf-optbench run`` arguments for one run at this shape: AdamW at GPT-3's 6e-4 / 0.1 with clipping at 1.0
    (bench_harness' settings since issue 8), GPT-3's cosine schedule, no evaluation or checkpoint (neither is part
    of a training step), the embedding padded to a multiple of ``pad`` rows (the project's default 64; the CPU
    demo's 1); with ``compile_``, torch.compile through ``compile_backend`` (TrainingArguments' default, inductor)."""
    return ["--model_size", size, "--data_source", "synthetic", "--synthetic_vocab_size", str(vocab),
            "--block_size", str(block), "--per_device_train_batch_size", str(batch), "--max_steps", str(steps),
            "--logging_steps", str(logging_steps), "--optimizer", "adamw", "--learning_rate", "6e-4",
            "--weight_decay", "0.1", "--max_grad_norm", "1.0", "--schedule", "gpt3_cosine", "--warmup_steps", "0.1",
            "--seed", "0", "--eval_strategy", "no", "--save_strategy", "no", "--save_final_model", "false",
            "--write_model_card", "false", "--pad_vocab_to_multiple_of", str(pad), "--output_dir", out,
            "--use_cpu", str(device == "cpu").lower(), "--bf16", str(bf16).lower(),
            "--torch_compile", str(compile_).lower(), "--dataloader_num_workers", "0",
            *(["--torch_compile_backend", compile_backend] if compile_ else [])]


def demo_run_args(steps: int, logging_steps: int, out: str) -> list[str]:
    """The CPU demo's AdamW comparison run (recipes/sweeps/cpu_demo.yaml: seed 1 at 1 token/param), with its
    steps, logging interval and output directory replaced; its own data, evaluation and tuning splits."""
    from hf_optbench.study.sweep_spec import load_sweep

    with contextlib.chdir(ROOT):  # the sweep names its base recipe relative to the repository
        spec = load_sweep(DEMO_SWEEP, output_dir=str(Path(out).parent / "sweep-never-created"))
    run = next(r for r in spec.runs if r.optimizer == "adamw" and r.budget_multiple is None)
    return run.args + ["--max_steps", str(steps), "--logging_steps", str(logging_steps), "--output_dir", out,
                       "--report_to", "none"]


@contextlib.contextmanager
def _in_memory_data(in_memory: bool) -> Iterator[None]:
    """Where the run's data come in memory, the synthetic source its arguments name (for the plan's vocabulary:
    GPT-2's in bench_gpu_mfu) is never generated, so the source's memory bound (config.bounds, issue 41: its tables
    at GPT-2's vocabulary would need ~150 GiB) does not apply; every other check of parse_args does."""
    import importlib.util

    if not in_memory or importlib.util.find_spec("hf_optbench.config.bounds") is None:  # an older checkout has none
        yield
        return
    from unittest import mock

    with mock.patch("hf_optbench.config.bounds.check_synthetic_memory", lambda values, room=None: None):
        yield


def project_trainer(argv: list[str], data: Any = None) -> tuple[Any, Any, Any, Any]:
    """(trainer, recorder, prepared, built) as ``hf_optbench.run.train.train`` builds them for ``argv``. ``data``: the
    training examples (in memory: a list of examples, or a packed split as ``run_path.packed_split`` makes) in place of the run's prepared splits; the model is
    then built as ``prepare`` builds it, with the data's vocabulary."""
    from hf_optbench.config.parse import parse_args
    from hf_optbench.models import build_model
    from hf_optbench.run import train as run_train
    from hf_optbench.run.plan import plan_record, resolve_plan

    with _in_memory_data(data is not None):
        cfg = parse_args(argv)
    plan = resolve_plan(cfg)
    if data is None:
        prepared = run_train.prepare(plan)
    else:
        torch.manual_seed(cfg.training.seed)
        vocab = cfg.data.synthetic_vocab_size
        model = build_model(plan.model.model_size, vocab, n_positions=plan.model.n_positions,
                            attn_implementation=cfg.model.attn_implementation,
                            pad_vocab_to_multiple_of=cfg.model.pad_vocab_to_multiple_of, dropout=cfg.model.dropout)
        prepared = run_train.Prepared(model, data, None, default_data_collator, None, None)
    built = run_train.build_optimization(plan, prepared.model)
    record = plan_record(plan, built.groups, built.impl)
    out = Path(cfg.training.output_dir)
    if hasattr(run_train, "assemble"):
        trainer, recorder, _ = run_train.assemble(plan, prepared, built, record, out)
    else:  # a checkout from before run.train.assemble (issue 42), for a before/after comparison with this script
        from hf_optbench.run.segments import SegmentRecorder

        callbacks, recorder = run_train._build_callbacks(plan, out, prepared.model, built, record, None)
        trainer = run_train._build_trainer(plan, prepared, built, [*callbacks, SegmentRecorder(out)], record)
    return trainer, recorder, prepared, built


def plain_model(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its class's own forward again (a run sets an instance forward that leaves the training logits
    out: hf_optbench.run.step_cost); nanoGPT's loop calls the model as it is."""
    model.__dict__.pop("forward", None)
    return model


class SyncClock(TrainerCallback):
    """Wall-clock stamps at each train-loss log, the Trainer's only host sync in a step (its ``loss.item()``
    runs just before ``on_log``): ``per_step`` divides each interval by the steps it covers."""

    def __init__(self) -> None:
        self.stamps: list[tuple[int, float]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.stamps.append((state.global_step, clock()))


def per_step(stamps: list[tuple[int, float]], skip: int) -> list[float]:
    """Step times from (step, time) stamps taken at syncs: each interval over its steps, once per step it covers
    (so a median weighs every step alike); an interval that starts before step ``skip`` ends is dropped (warm-up:
    with a sync every N steps, whole intervals go)."""
    out: list[float] = []
    for (s0, t0), (s1, t1) in zip(stamps, stamps[1:], strict=False):
        if s0 >= skip and s1 > s0:
            out += [(t1 - t0) / (s1 - s0)] * (s1 - s0)
    return out


def random_blocks(n_blocks: int, block: int, vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n_blocks, block), generator=g)


def as_examples(blocks: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """The Trainer's view of the same blocks: one example per row, labels = inputs (the model shifts them)."""
    return [{"input_ids": row, "labels": row} for row in blocks]


def packed_split(blocks: torch.Tensor) -> Any:
    """The same blocks as a packed split (``hf_optbench.data.cache.block_schema``: int32 lists, labels = inputs), the
    form a run's data take, so the run's Trainer reads them through its block view as a run does."""
    import datasets
    import pyarrow as pa

    rows = pa.array(blocks.to(torch.int32).tolist(), type=pa.list_(pa.int32()))
    return datasets.Dataset(pa.table({"input_ids": rows, "labels": rows}))


def plain_loop(model: torch.nn.Module, blocks: torch.Tensor, batch: int, optimizer: Any, scheduler: Any, steps: int,
               log_interval: int, *, device: str = "cpu", bf16: bool = False, step_model: Any = None,
               timed: Callable[[str], Any] | None = None, on_sync: Callable[[int], None] | None = None,
               grad_clip: float = 1.0) -> list[tuple[int, float]]:
    """nanoGPT's loop over ``blocks`` (rows taken in order, ``batch`` at a time; labels = inputs); returns (step,
    time) at each sync (every ``log_interval`` steps and the last). ``step_model``: the module to call (a compiled
    one); ``timed(name)``: a context manager around each part (the breakdown's timer); ``on_sync(step)``: called
    right after each sync (and at the start, step 0)."""
    from contextlib import nullcontext

    timed = timed or (lambda name: nullcontext())
    call = step_model if step_model is not None else model
    cuda = device.startswith("cuda")
    model.train()

    def get_batch(i: int) -> torch.Tensor:  # nanoGPT: pinned, then an asynchronous copy to the GPU
        x = blocks[(i * batch) % len(blocks):][:batch]
        return x.pin_memory().to(device, non_blocking=True) if cuda else x

    with timed("data"):
        x = get_batch(0)
    stamps = [(0, clock())]
    if on_sync is not None:
        on_sync(0)
    for step in range(1, steps + 1):
        with timed("forward"), torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            loss = call(input_ids=x, labels=x).loss
        with timed("data"):
            x = get_batch(step)  # prefetch while the forward runs
        with timed("backward"):
            loss.backward()
        if grad_clip:
            with timed("clip_grad_norm"):
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        with timed("optimizer step"):
            optimizer.step()
        with timed("scheduler step"):
            scheduler.step()
        with timed("zero_grad"):
            optimizer.zero_grad(set_to_none=True)
        if step % log_interval == 0 or step == steps:
            with timed("loss log (sync)"):
                loss.item()  # nanoGPT: lossf = loss.item() * gradient_accumulation_steps
            stamps.append((step, clock()))
            if on_sync is not None:
                on_sync(step)
    return stamps


def machine_facts() -> dict[str, Any]:
    """Date, machine, torch and the load average now (read it before measuring: the machine's own load)."""
    import platform

    return {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {os.cpu_count()} cores",
            "torch": torch.__version__, "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def write_results(out_dir: str, stem: str, result: dict[str, Any], render: Callable[[dict[str, Any], str], str],
                  script: str, argv: list[str] | None) -> str:
    """``out_dir/stem.json`` and ``stem.md`` (``render(result, command)``, headed by the command that wrote it);
    returns the markdown."""
    import json
    import sys

    command = f"python benchmarks/{script}" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    text = render(result, command)
    (out / f"{stem}.md").write_text(text, encoding="utf-8")
    return text
