"""Step-time calibration: each compared optimizer x size x batch shape's training step, measured alone.

Why: a sweep's runs share the machine (two at a time on two cores, say), so their own step times say how long the
sweep took, not what one optimizer's step costs against another's; and a token speedup says nothing of time. At the
end of every sweep (after the comparison and the attribution, before it returns) :func:`run_sweep_calibration`
measures each compared (optimizer, model_size, shape) alone, one at a time, nothing else in flight, interleaved over
rounds (A B C D, B C D A, ...: a drift of the machine spreads over every entry alike), the first steps of every round
dropped (allocator and caches warming), and writes ``<sweep_dir>/step_calibration.json`` (schema below, read by the
report's time-to-quality table). After its first rounds it goes on, up to twice as many, while an optimizer's
step-time ratio to the baseline is not within the tolerance of :mod:`hf_optbench.measure.step_ratio` (its interval
from the rounds' pooled spread): a noisy machine gets more rounds, a quiet one no more than before. The sweep's ETA
(:mod:`hf_optbench.study.eta`) uses the same measurement, short, in process (:func:`quick_step_times`) for the
relative cost of optimizers no run has measured yet.

What one step is here: the Trainer's work per optimizer step without the Trainer: ``gradient_accumulation_steps``
forward and backward passes of the run's micro-batch (random token ids of the run's vocabulary: the cost does not
depend on the values), gradient clipping at the run's ``max_grad_norm``, the optimizer's step (built from the run's
own resolved plan) and ``zero_grad``, the loss read back each step (as the Trainer's logging does). One process: under
a multi-process launcher it is one rank's step without the all-reduce. Muon's Newton-Schulz precision is the one its
runs recorded (``hyperparameters.ns_precision`` of a finished run's summary.json) where one has: ``auto`` is timed and
cached per machine, and a calibration that resolved it afresh could time another precision than the runs trained in.

Schema (``schema`` 1; keep it: the report reads it)::

    {"schema": 1, "machine": {"cpu_model", "cpu_capability", "bf16_native", "torch", "device": "cpu"|"cuda:NAME",
     "threads"}, "measured_at": ISO time, "rounds": int (measured), "steps_per_round": int,
     "first_rounds": int, "max_rounds": int, "tolerance": float (the ratios' stable half-width),
     "entries": [{"optimizer", "model_size", "tokens_per_step", "ns_precision": str|null, "step_time_median_s",
                  "step_time_round_medians_s": [...] in round order, "spread": [min, max] of the round medians}]}

(``first_rounds``, ``max_rounds`` and ``tolerance`` are absent from files written before rounds were added: their
``rounds`` were all they measured.) A sweep file turns it off with ``calibration: false`` (test sweeps) or sizes it
with ``calibration: {rounds: 3, steps_per_round: 12}`` (``rounds``: the first rounds); it is skipped where the sweep
cannot measure what its runs ran (``launcher.type: command``). Under the SLURM executor it runs as one more job of the sweep, with the runs' launcher.slurm parameters: measured on
the cluster's nodes, where the runs ran, not on the machine that submitted them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_optbench.machine import cpu_model, slurm_job_id
from hf_optbench.rundir import BASELINE, STATE_FILE, read_summary, write_json_atomic
from hf_optbench.study.sweep_spec import SweepSpec
from hf_optbench.study.sweep_state import launcher_environ, plan_slots

CALIBRATION_FILE = "step_calibration.json"
SCHEMA = 1
# A few dozen steps per entry and round: 3 rounds of 30 measured steps after 10 dropped ones (120 steps; at the
# demo's shape ~7 ms each, about 1 s per optimizer), then up to 3 more while a ratio is not stable
# (measure.step_ratio.more_rounds). Each round builds its entry afresh, and its first steps run cold (allocator,
# oneDNN's kernel choice): with fewer dropped steps the plain step reads up to 1.7x a whole run's, more for some
# optimizers than others, which would distort their ratios to AdamW's (docs/notes/study_measurements.md).
ROUNDS, STEPS_PER_ROUND, WARMUP_STEPS = 3, 30, 10
# The vocabulary assumed for a text source before any run has reported its own (the GPT-2 tokenizer's): only the
# ETA's first estimate uses it; the end-of-sweep calibration reads each run's summary.json.
DEFAULT_VOCAB = 50257
# The calibration subprocess: imports (~3-5 s here) plus the measurement; past this it is stopped, the sweep's results
# are kept, and the calibration is reported missing.
TIMEOUT_S = 900


@dataclass(frozen=True)
class Entry:
    """One thing to measure: a run's arguments (without --output_dir), its vocabulary (None: from the data
    settings) and the Newton-Schulz precision its runs recorded (None: as the arguments resolve it)."""

    optimizer: str
    model_size: str
    args: tuple[str, ...]
    vocab_size: int | None = None
    ns_precision: str | None = None


@dataclass
class Case:
    """An entry built: the model, its optimizer and its step's inputs."""

    entry: Entry
    model: Any
    optimizer: Any
    batches: list[Any]
    max_grad_norm: float
    tokens_per_step: int
    ns_precision: str | None
    autocast: Any  # a context-manager factory


# ------------------------------------------------------------------------------------------- building one entry
def _vocab(cfg: Any, entry: Entry) -> int:
    """The vocabulary the entry's runs train with: a finished run's record, the synthetic source's setting, the
    run's tokenizer where it loads without the network (shipped, a local directory or the Hub cache), else GPT-2's.
    The LM head is most of a small model's step: measured with GPT-2's 50,257 rows instead of the shipped Thai
    tokenizer's 2,000, the quickstart's tiny step read 1.6 s against 0.1 s."""
    if entry.vocab_size:
        return int(entry.vocab_size)
    if cfg.data.data_source == "synthetic":
        return int(cfg.data.synthetic_vocab_size)
    return _local_tokenizer_vocab(cfg.data.tokenizer_name) or DEFAULT_VOCAB


@functools.cache
def _local_tokenizer_vocab(name: str | None) -> int | None:
    """``len()`` of the tokenizer ``name`` if it is on this machine (never downloads: this is only an estimate).
    Read once per name: every entry, and every round of a measurement, builds its case afresh."""
    from hf_optbench.data.tokenizers import (
        BUILTIN_PREFIX,
        in_hub_cache,
        load_tokenizer,
        resolve_tokenizer_path,
    )

    if not name:
        return None
    try:
        local = name.startswith(BUILTIN_PREFIX) or os.path.isdir(resolve_tokenizer_path(name)) or in_hub_cache(name)
        return len(load_tokenizer(name)) if local else None
    except Exception:  # noqa: BLE001 - the estimate falls back to GPT-2's vocabulary; the run reports the real error
        return None


def build_case(entry: Entry, scratch: Path) -> Case:
    """The entry's model (its size and vocabulary, seeded), its optimizer as the run's plan resolves it (tuned file,
    cited values; the Newton-Schulz precision its runs recorded, else as resolved) and one step's random inputs.
    ``scratch``: an output_dir never created."""
    import torch

    from hf_optbench.config.parse import parse_args
    from hf_optbench.models import build_model
    from hf_optbench.optim.registry import build_resolved
    from hf_optbench.run.plan import resolve_optimization, train_device

    hardware = [] if torch.cuda.is_available() else ["--use_cpu", "true"]
    cfg = parse_args([*entry.args, "--output_dir", str(scratch), *hardware])
    opt, mgn, _ = resolve_optimization(cfg)
    device, t = train_device(cfg), cfg.training
    torch.manual_seed(0)
    model = build_model(cfg.model.model_size, _vocab(cfg, entry), n_positions=cfg.model.n_positions or cfg.data.block_size,
                        attn_implementation=cfg.model.attn_implementation,
                        pad_vocab_to_multiple_of=cfg.model.pad_vocab_to_multiple_of, dropout=cfg.model.dropout).to(device)
    model.train()
    ctor = opt.constructor_values()
    if entry.ns_precision and "ns_precision" in ctor:
        ctor["ns_precision"] = entry.ns_precision
    optimizer, _ = build_resolved(opt.spec or opt.name, model, lr=opt.learning_rate.value,
                                  weight_decay=opt.weight_decay.value, ctor=ctor,
                                  embedding_state_32bit=opt.embedding_state_32bit)
    if callable(getattr(optimizer, "train", None)):
        optimizer.train()  # schedule-free optimizers step in train mode
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, vocab, (t.per_device_train_batch_size, cfg.data.block_size), generator=gen).to(device)
               for _ in range(t.gradient_accumulation_steps)]
    dtype = torch.bfloat16 if t.bf16 else torch.float16 if t.fp16 else None
    autocast = (lambda: torch.autocast(device, dtype=dtype)) if dtype is not None else contextlib.nullcontext
    ns = ctor.get("ns_precision")
    return Case(entry, model, optimizer, batches, float(mgn.value or 0.0),
                t.per_device_train_batch_size * t.gradient_accumulation_steps * cfg.data.block_size,
                None if ns is None else str(ns), autocast)


def _sync(case: Case) -> None:
    import torch

    if next(case.model.parameters()).is_cuda:
        torch.cuda.synchronize()


def time_steps(case: Case, steps: int) -> list[float]:
    """Seconds of each of ``steps`` training steps of ``case`` (see the module doc for what one step is)."""
    import torch

    from hf_optbench.optim.registry import manual_step_hook

    after = manual_step_hook(case.optimizer)  # Sophia-G's Hessian estimate, as a loop outside the Trainer runs it
    out = []
    for step in range(steps):
        _sync(case)
        t0 = time.perf_counter()
        total = 0.0
        for x in case.batches:
            with case.autocast():
                loss = case.model(input_ids=x, labels=x).loss / len(case.batches)
            loss.backward()
            total += float(loss.detach())
        if case.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(case.model.parameters(), case.max_grad_norm)
        case.optimizer.step()
        if after is not None:
            after(case.model, case.optimizer, {"input_ids": case.batches[-1], "labels": case.batches[-1]},
                  step=step, accumulation_steps=len(case.batches), autocast_dtype=None)
        case.optimizer.zero_grad(set_to_none=True)
        _sync(case)
        out.append(time.perf_counter() - t0)
    return out


# ------------------------------------------------------------------------------------------------ measuring
@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` (the runs' count) for the block, then put back."""
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measure(entries: Sequence[Entry], *, rounds: int = ROUNDS, steps: int = STEPS_PER_ROUND,
            warmup: int = WARMUP_STEPS, scratch: Path | None = None,
            say: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    """Each entry's step times, interleaved over ``rounds`` first rounds and then more, up to twice as many, while a
    ratio to the baseline is not stable (``measure.step_ratio.more_rounds``); every round builds each entry afresh,
    drops its first ``warmup`` steps and keeps ``steps``. The schema's ``entries``, in the given order. Entries that
    build to the same optimizer, size, shape and Newton-Schulz precision are measured once."""
    import gc

    from hf_optbench.measure.step_ratio import more_rounds

    scratch = scratch or Path(tempfile.gettempdir()) / "hf_optbench-calibration-never-created"
    kept: dict[int, list[list[float]]] = {i: [] for i in range(len(entries))}
    meta: dict[int, tuple[Any, ...]] = {}
    done = 0
    while done == 0 or more_rounds(_shapes(kept, meta), BASELINE, done, rounds):
        for i in [(done + k) % len(entries) for k in range(len(entries))]:  # each round starts one entry later
            case = build_case(entries[i], scratch)
            meta[i] = (case.entry.optimizer, case.entry.model_size, case.tokens_per_step, case.ns_precision)
            times = time_steps(case, warmup + steps)[warmup:]
            kept[i].append(times)
            del case
            gc.collect()
        done += 1
        say(f"calibration round {done} done ({rounds} first, up to {2 * rounds})")
    out = []
    for i in _distinct(meta):
        medians = [statistics.median(ts) for ts in kept[i]]
        opt, size, tokens, ns = meta[i]
        out.append({"optimizer": opt, "model_size": size, "tokens_per_step": int(tokens), "ns_precision": ns,
                    "step_time_median_s": statistics.median([t for ts in kept[i] for t in ts]),
                    "step_time_round_medians_s": medians, "spread": [min(medians), max(medians)]})
    return out


def _distinct(meta: dict[int, tuple[Any, ...]]) -> list[int]:
    """The first entry of each distinct (optimizer, size, shape, Newton-Schulz precision), in order."""
    first: dict[tuple[Any, ...], int] = {}
    for i in sorted(meta):
        first.setdefault(meta[i], i)
    return list(first.values())


def _shapes(kept: dict[int, list[list[float]]], meta: dict[int, tuple[Any, ...]]) -> list[dict[str, list[float]]]:
    """The round medians measured so far, one {optimizer: medians} per size and shape (what the ratios pair)."""
    out: dict[tuple[Any, ...], dict[str, list[float]]] = {}
    for i in _distinct(meta):
        opt, size, tokens, _ = meta[i]
        out.setdefault((size, tokens), {})[opt] = [statistics.median(ts) for ts in kept[i]]
    return list(out.values())


def quick_step_times(entries: Sequence[Entry], threads: int | None, steps: int = 30,
                     warmup: int = WARMUP_STEPS) -> dict[tuple[str, str], float]:
    """{(optimizer, size): median seconds per step} from a short in-process measurement (one round, past the cold
    first steps: see :data:`WARMUP_STEPS`): the ETA's cost of each optimizer x size before its runs say more (~3 s
    for four optimizers at the demo's size). An entry that cannot be built here (a sweep that skips validation, an
    optimizer needing a GPU) is left out: its runs will say what it costs."""
    out = {}
    with torch_threads(threads):
        for entry in entries:
            try:
                (row,) = measure([entry], rounds=1, steps=steps, warmup=warmup)
            except Exception:  # noqa: BLE001 - only the estimate loses this entry; the run reports the real error
                continue
            out[(row["optimizer"], row["model_size"])] = float(row["step_time_median_s"])
    return out


def machine_record() -> dict[str, Any]:
    """The schema's ``machine``: what the steps were measured on."""
    import torch

    from hf_optbench.optim.muon_precision import bf16_matmul_native

    device = "cuda" if torch.cuda.is_available() else "cpu"
    native, _ = bf16_matmul_native(device)
    return {"cpu_model": cpu_model(), "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
            "bf16_native": bool(native), "torch": torch.__version__,
            "device": f"cuda:{torch.cuda.get_device_name()}" if device == "cuda" else "cpu",
            "threads": int(torch.get_num_threads()), "host": socket.gethostname(), "slurm_job_id": slurm_job_id()}


def calibrate(entries: Sequence[Entry], *, rounds: int = ROUNDS, steps: int = STEPS_PER_ROUND,
              warmup: int = WARMUP_STEPS, say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """The whole ``step_calibration.json`` document for ``entries`` (``rounds``: the first rounds)."""
    from hf_optbench.measure.step_ratio import TOLERANCE

    rows = measure(entries, rounds=rounds, steps=steps, warmup=warmup, say=say)
    return {"schema": SCHEMA, "machine": machine_record(),
            "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "rounds": len(rows[0]["step_time_round_medians_s"]) if rows else 0, "steps_per_round": steps,
            "first_rounds": rounds, "max_rounds": 2 * rounds, "tolerance": TOLERANCE, "entries": rows}


# ------------------------------------------------------------------------------------------------ the sweep's
def settings(spec: SweepSpec) -> dict[str, int] | None:
    """The sweep's calibration (``calibration:`` in the file: false, or rounds / steps_per_round), None when off."""
    raw = getattr(spec, "calibration", None)
    if raw is False:
        return None
    raw = raw if isinstance(raw, dict) else {}
    return {"rounds": int(raw.get("rounds", ROUNDS)), "steps": int(raw.get("steps_per_round", STEPS_PER_ROUND)),
            "warmup": WARMUP_STEPS}


def skip_reason(spec: SweepSpec) -> str | None:
    """Why this sweep's end has no calibration, or None when it has one."""
    if settings(spec) is None:
        return "turned off by the sweep file (calibration: false)"
    if spec.launcher.get("type") == "command":
        return "launcher.type command: the sweep cannot know what its command runs"
    return None


def compared_entries(spec: SweepSpec) -> list[Entry]:
    """One entry per compared optimizer x size (its runs share their batch shape: base, overrides and the per-point
    keys; rungs and the attribution runs step alike), with the vocabulary and the Newton-Schulz precision a finished
    run of it reported."""
    out: dict[tuple[str, str], Entry] = {}
    for run in spec.runs:
        if run.phase != "compare" or run.budget_multiple is not None:
            continue
        key = (run.optimizer, run.model_size)
        summary = read_summary(spec.run_dir(run)) or {}
        vocab, ns = summary.get("vocab_size"), recorded_ns_precision(summary)
        if key not in out or (vocab and not out[key].vocab_size):
            out[key] = Entry(run.optimizer, run.model_size, _runnable(run.args), int(vocab) if vocab else None, ns)
    return list(out.values())


def recorded_ns_precision(summary: Mapping[str, Any]) -> str | None:
    """The Newton-Schulz precision a run's summary.json records it trained with (``hyperparameters.ns_precision``,
    resolved from ``auto``), None for a run without one (not Muon, or not finished)."""
    hyper = summary.get("hyperparameters")
    entry = hyper.get("ns_precision") if isinstance(hyper, Mapping) else None
    value = entry.get("value") if isinstance(entry, Mapping) else None
    return str(value) if value in ("bf16", "fp32") else None


def _runnable(args: Sequence[str]) -> tuple[str, ...]:
    """A run's arguments without a tuned file not written yet (before the tuning phase: the cited rates, which a
    step's cost does not depend on)."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--tuned_hparams_file" and i + 1 < len(args) and not os.path.isfile(args[i + 1]):
            continue
        if i and args[i - 1] == "--tuned_hparams_file" and not os.path.isfile(arg):
            continue
        out.append(arg)
    return tuple(out)


def run_cores(spec: SweepSpec) -> list[int]:
    """The cores one of the sweep's runs had: its slot's when the runs were pinned (several at once), else every
    core this process may use (one run at a time, unpinned)."""
    slot = plan_slots(spec.launcher, max(2, len(spec.runs)))[0]
    return list(slot.cpus) if slot.cpus else sorted(os.sched_getaffinity(0))


def run_threads(spec: SweepSpec) -> int:
    """torch threads one of the sweep's runs used: OMP_NUM_THREADS of launcher.env or the environment, else its
    cores."""
    env = launcher_environ(spec.launcher)
    try:
        return max(1, int(env["OMP_NUM_THREADS"]))
    except (KeyError, ValueError):
        return len(run_cores(spec))


def run_sweep_calibration(spec: SweepSpec, say: Callable[[str], None]) -> Path | None:
    """Measure the sweep's compared entries in a child process with the runs' environment (``launcher.env``: its
    thread count, allocator settings) pinned to as many cores as one run uses (under the SLURM executor: a job on
    the cluster, study.slurm.run_job), and write
    ``<sweep_dir>/step_calibration.json``; None (said) when skipped or when it failed: the sweep's results stand
    either way."""
    reason, cfg = skip_reason(spec), settings(spec)
    if reason is not None or cfg is None:
        say(f"step-time calibration skipped: {reason}")
        return None
    entries = compared_entries(spec)
    if not entries:
        return None
    out = spec.output_dir / CALIBRATION_FILE
    states = [p.stat().st_mtime for p in spec.output_dir.glob(f"**/{STATE_FILE}")]
    if out.is_file() and states and out.stat().st_mtime >= max(states):
        say(f"step-time calibration: {out} is newer than every run of the sweep: kept")
        return out
    if spec.launcher.get("executor") == "slurm":
        return _calibrate_on_cluster(spec, entries, cfg, out, say)
    env = launcher_environ(spec.launcher)
    cores = run_cores(spec)
    with tempfile.TemporaryDirectory() as tmp:
        request = Path(tmp) / "entries.json"
        _write_request(request, entries, cfg)
        say(f"step-time calibration: {len(entries)} optimizer x size entries, {cfg['rounds']} interleaved rounds "
            f"of {cfg['steps']} steps each (up to {2 * cfg['rounds']} while a ratio is unstable), alone on cores "
            f"{','.join(map(str, cores))}")
        t0 = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-m", "hf_optbench.study.calibration", str(request), str(out),
                                   "--cores", ",".join(map(str, cores))],
                                  env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            say(f"step-time calibration stopped after {TIMEOUT_S} s: no {CALIBRATION_FILE}")
            return None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1][:300]
        say(f"step-time calibration failed (exit {proc.returncode}: {last}): no {CALIBRATION_FILE}")
        return None
    say(f"step-time calibration -> {out} ({time.monotonic() - t0:.1f} s)")
    return out


def _write_request(path: Path, entries: Sequence[Entry], cfg: dict[str, int]) -> None:
    """The child's request: the entries and the calibration's size."""
    path.write_text(json.dumps({"entries": [vars(e) | {"args": list(e.args)} for e in entries], **cfg}))


def _calibrate_on_cluster(spec: SweepSpec, entries: Sequence[Entry], cfg: dict[str, int], out: Path,
                          say: Callable[[str], None]) -> Path | None:
    """The calibration child as a job of the sweep's cluster (study.slurm.run_job): the request and the log in the
    sweep directory, which the node shares; the job's cores are SLURM's allocation, as each run's were."""
    from hf_optbench.study.slurm import run_job

    request, log = spec.output_dir / "step_calibration.request.json", spec.output_dir / "step_calibration.log"
    _write_request(request, entries, cfg)
    env = {str(k): str(v) for k, v in (spec.launcher.get("env") or {}).items()} | {"PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    rc = run_job(spec, [sys.executable, "-m", "hf_optbench.study.calibration", str(request), str(out)], str(log),
                 env, TIMEOUT_S, lambda text: say(f"step-time calibration: {text}"))
    request.unlink(missing_ok=True)
    if rc != 0 or not out.is_file():
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.is_file() else []
        last = (lines or ["?"])[-1][:300]
        say(f"step-time calibration failed (exit {rc}: {last}): no {CALIBRATION_FILE}")
        return None
    say(f"step-time calibration -> {out} ({time.monotonic() - t0:.1f} s, measured on "
        f"{json.loads(out.read_text())['machine'].get('host')})")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m hf_optbench.study.calibration REQUEST.json OUT.json``: the sweep's child process."""
    parser = argparse.ArgumentParser(prog="python -m hf_optbench.study.calibration")
    parser.add_argument("request")
    parser.add_argument("output")
    parser.add_argument("--cores", default="", help="pin this process to these cores first (comma-separated)")
    args = parser.parse_args(argv)
    if args.cores:  # before torch starts its threads
        os.sched_setaffinity(0, [int(c) for c in args.cores.split(",")])
    request = json.loads(Path(args.request).read_text(encoding="utf-8"))
    entries = [Entry(e["optimizer"], e["model_size"], tuple(e["args"]), e.get("vocab_size"), e.get("ns_precision"))
               for e in request["entries"]]
    doc = calibrate(entries, rounds=request["rounds"], steps=request["steps"], warmup=request["warmup"])
    write_json_atomic(args.output, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
