"""Muon's ``ns_precision: auto`` on a CPU, by measurement: Newton-Schulz timed in bf16 and in fp32 on the run's own
matrix shapes, once per machine, and the faster precision taken that passes an accuracy check against fp32.

Why measured, not read from the hardware: where bf16 matmuls are native the faster precision still depends on the
shapes. On this project's AMD EPYC (Zen 4, AVX-512-BF16) the two were level at ``tiny`` (2.10 ms per Newton-Schulz
pass in bf16 against 2.02 in fp32) and bf16 took half fp32's time at ``mini`` (13.99 against 26.83 ms;
benchmarks/results/muon_step.md): small matrices pay bf16's conversions, large ones gain its doubled matmul rate. Where bf16 is emulated (an AVX2-only
CPU) the timing shows it 10-20x slower and fp32 is taken, as the capability rule took it.

What is timed: the CPU time of one Newton-Schulz pass over the run's hidden matrices as :class:`~hf_optbench.optim.muon_impl.MuonNS`
runs it (same-shape matrices stacked, ``muon_batched``), Gaussian inputs, one torch thread (the CPU study trains one
run per core, each on one thread, and one thread keeps the choice the same in every process that plans the run: a
sweep's validation and its runs), warm-up passes dropped, the two precisions alternating, the best of
:data:`REPEATS`; emulated bf16, one pass (:data:`HOPELESS`). The accuracy check: the bf16
result's relative Frobenius distance to the fp32 one on the same inputs, at most :data:`ACCURACY_LIMIT`.

Why cached: the choice is part of the run's identity (it changes what is trained), so every run of a study on one
machine must make the same one; a second timing under another load could flip it. The first run that plans Muon on
a machine measures and writes ``ns_precision.json`` in the data cache directory (keyed by the CPU model, torch's
version and the CPU capability torch runs with, so an ``ONEDNN_MAX_CPU_ISA=AVX2`` emulation is a machine of its own;
inside, by the shapes); every later plan reads it. Plans that start together queue on a lock beside the file, and the
first record stored wins: a process that finds one stored while it measured takes the stored one. The write is
atomic (write, rename), so a reader never sees half a file. A Python-API build (no data cache) keeps the measurement in its
process.

Only torch-free at import (the plan imports it); torch is imported by the measurement.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hf_optbench.machine import cpu_model
from hf_optbench.rundir import write_json_atomic

CACHE_FILE = "ns_precision.json"
# Part of every cache key: raised when what is timed changes (the stacking, the passes), so old timings are not read.
TIMING_VERSION = 2
# The bf16 result's relative Frobenius distance to fp32's: 0.010-0.018 measured on Gaussian matrices of the CPU and
# GPT-2 shapes (32 x 32 to 768 x 3072, ns_steps 5); the results of the two differ by no measurable amount at that
# distance (benchmarks/results/ns_precision.md: final eval loss -0.0004 [-0.0038, +0.0031] nats, "level"). The
# limit, about 3x the largest measured, refuses a bf16 path that computes something else, not bf16's rounding.
ACCURACY_LIMIT = 0.05
REPEATS = 5
# bf16 is taken only when its pass is at least this fraction faster than fp32's; a nearer race keeps fp32 (the
# reference, and the more exact). At tiny the two passes are within a few % and their order flips from one run of
# benchmarks/bench_muon_step.py to the next (benchmarks/results/muon_step.md: bf16 2.10 ms against fp32's 2.02); at
# mini bf16's pass takes about half fp32's time (13.99 against 26.83 ms there), far outside that margin.
MARGIN = 0.10
# bf16 is not timed further when its last warm-up pass (where bf16 is native, the second: the first builds oneDNN's
# kernels; where emulated, the only one) took this many times fp32's: emulated bf16's pass measured 15-19x fp32's
# here (30.67 against 2.01 ms at tiny, 537.11 against 28.12 at mini under AVX2), native bf16's 0.5-1.05x
# (benchmarks/results/muon_step.md), so 10x parts the two.
HOPELESS = 10.0

Timer = Callable[[list[tuple[int, int]]], dict[str, Any]]
_MEMO: dict[tuple[str, str], dict[str, Any]] = {}


def bf16_matmul_native(device_type: str) -> tuple[bool, str]:
    """(whether a bf16 matmul runs natively on this device, what torch reported), read from torch once.

    CUDA: ``torch.cuda.is_bf16_supported(including_emulation=False)`` (compute capability >= 8: Ampere and later).
    CPU: both of
      * ``torch.ops.mkldnn._is_mkldnn_bf16_supported()``: torch sends a CPU bf16 matmul to oneDNN only when this holds
        (it reads the ISA oneDNN may use, so ``ONEDNN_MAX_CPU_ISA=AVX2`` turns it off); otherwise ATen's reference
        gemm runs it, measured at 2.6-3.1 GFLOP/s against 54-92 in fp32 on this project's AMD EPYC (Zen 4) with that
        setting, 1.3-2.5 against 31-63 on an AVX2-only EPYC;
      * on x86, bf16 instructions in the hardware: ``torch.cpu._is_avx512_bf16_supported()`` or
        ``_is_amx_tile_supported()`` (CPUID, through cpuinfo). oneDNN also takes bf16 on AVX-512 without them
        (Skylake-X, Cascade Lake) by converting in software; not measured here, so fp32 is the choice there: the
        precision the hardware computes in. On other architectures oneDNN's own check reads the ARM BF16
        extension, and it alone decides.
    """
    import torch

    if device_type == "cuda":
        ok = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False))
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
        return ok, f"CUDA {name}: torch.cuda.is_bf16_supported(including_emulation=False) {ok}"
    onednn = bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
        avx512_bf16, amx = bool(torch.cpu._is_avx512_bf16_supported()), bool(torch.cpu._is_amx_tile_supported())
        return onednn and (avx512_bf16 or amx), (f"CPU: oneDNN bf16 matmul {onednn} "
                                                 f"(torch.ops.mkldnn._is_mkldnn_bf16_supported()), AVX512-BF16 "
                                                 f"{avx512_bf16}, AMX {amx}")
    return onednn, f"CPU ({platform.machine()}): oneDNN bf16 matmul {onednn} (torch.ops.mkldnn._is_mkldnn_bf16_supported())"


def gpt2_matrix_shapes(n_layer: int, n_embd: int) -> list[tuple[int, int]]:
    """The hidden matrices Muon orthogonalises in a GPT-2 of that shape (Conv1D (in, out): c_attn, the attention's
    c_proj, c_fc, the MLP's c_proj per block; ``n_inner`` is GPT-2's 4 x n_embd)."""
    d = int(n_embd)
    return [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)] * int(n_layer)


def shapes_key(shapes: Iterable[tuple[int, int]]) -> str:
    """The cache's key for a set of matrices: each oriented shape with its count (the order does not matter)."""
    counts: dict[tuple[int, int], int] = {}
    for rows, cols in shapes:
        key = (min(rows, cols), max(rows, cols))
        counts[key] = counts.get(key, 0) + 1
    return ",".join(f"{n}x{m}x{k}" for (m, k), n in sorted(counts.items()))


def machine_key() -> str:
    """What the timing depends on besides the shapes: the CPU, torch's version and the capability it runs with (and
    :data:`TIMING_VERSION`)."""
    import torch

    native, _ = bf16_matmul_native("cpu")
    return (f"{cpu_model()} | torch {torch.__version__} | {torch.backends.cpu.get_cpu_capability()} | "
            f"bf16 native {native} | timing {TIMING_VERSION}")


def measure(shapes: list[tuple[int, int]]) -> dict[str, Any]:
    """{"bf16_ms", "fp32_ms": best pass over the shapes (ms), "bf16_error": relative distance to fp32's result,
    "bf16_timed": whether bf16 was timed past its warm-up (see :data:`HOPELESS`)}, on one torch thread."""
    import torch

    from hf_optbench.optim.muon_impl import orthogonalise

    gen = torch.Generator().manual_seed(0)
    mats = [torch.randn(s, generator=gen) for s in shapes]
    coefficients = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's defaults (torch/optim/_muon.py DEFAULT_A/B/C)

    def one_pass(dtype: torch.dtype) -> tuple[float, list[torch.Tensor]]:
        t0 = time.thread_time()  # this thread's CPU time (torch on one thread runs here): others' load adds nothing
        out = orthogonalise(mats, dtype, coefficients, 5, 1e-7)
        return time.thread_time() - t0, out

    native, _ = bf16_matmul_native("cpu")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fp32 = one_pass(torch.float32)[0]
        warm, out16 = one_pass(torch.bfloat16)
        if native:  # the first bf16 call builds oneDNN's kernels (20 ms at tiny here): a second warm-up of each
            fp32 = one_pass(torch.float32)[0]
            warm, out16 = one_pass(torch.bfloat16)
        # emulated bf16 (torch's reference gemm) has no kernels to build: its one pass shows it hopeless, and a
        # second would cost as much again (0.5 s at mini)
        timed = warm < HOPELESS * fp32
        fp32_times, bf16_times = [fp32], [warm]
        for _ in range(REPEATS):  # the precisions alternate, so a change of the machine's load falls on both
            fp32_times.append(one_pass(torch.float32)[0])
            if timed:
                bf16_times.append(one_pass(torch.bfloat16)[0])
        ref = one_pass(torch.float32)[1]
    finally:
        torch.set_num_threads(before)
    fp32, bf16 = min(fp32_times), min(bf16_times)
    num = sum(float((a.float() - b).norm()) ** 2 for a, b in zip(out16, ref, strict=True))
    den = sum(float(b.norm()) ** 2 for b in ref)
    return {"bf16_ms": 1e3 * bf16, "fp32_ms": 1e3 * fp32, "bf16_error": (num / den) ** 0.5, "bf16_timed": timed,
            "bf16_native": native}


def choose(record: Mapping[str, Any], limit: float = ACCURACY_LIMIT) -> tuple[str, str]:
    """(precision, why) from a measurement: bf16 where it passed the accuracy check and was faster by at least
    :data:`MARGIN`, else fp32 (the reference the check compares with). Where bf16 was not timed past one pass (:data:`HOPELESS`), ``why`` says so,
    and whether torch reported bf16 matmuls native."""
    bf16, fp32, err = float(record["bf16_ms"]), float(record["fp32_ms"]), float(record["bf16_error"])
    timings = f"bf16 {bf16:.2f} ms, fp32 {fp32:.2f} ms per Newton-Schulz pass"
    if not record.get("bf16_timed", True):
        native = record.get("bf16_native")
        emulated = "" if native is None else " (bf16 matmuls native)" if native else " (bf16 matmuls emulated here)"
        return "fp32", (f"{timings}; bf16's warm-up pass took over {HOPELESS:g}x fp32's{emulated}, so it was not timed "
                        "further: fp32 is faster")
    if err > limit:
        return "fp32", f"{timings}; bf16 {err:.4f} from fp32's result, over the limit {limit}"
    if bf16 < fp32 and bf16 > (1 - MARGIN) * fp32:
        return "fp32", (f"{timings}; bf16 {err:.4f} from fp32's result (limit {limit}): bf16 is faster by less than "
                        f"{MARGIN:.0%}, so fp32, the reference")
    pick = "bf16" if bf16 < fp32 else "fp32"
    return pick, f"{timings}; bf16 {err:.4f} from fp32's result (limit {limit}): {pick} is faster"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _entry(data: Mapping[str, Any], machine: str, key: str) -> dict[str, Any] | None:
    """The record for this machine and shapes in a cache file's contents, if it holds one."""
    entries = data.get(machine)
    record = entries.get(key) if isinstance(entries, dict) else None
    return record if isinstance(record, dict) else None


def _stored(path: Path | None, machine: str, key: str) -> dict[str, Any] | None:
    """The cache file's record for this machine and shapes, if one is stored."""
    return _entry(_read(path), machine, key) if path is not None else None


@contextmanager
def _writer_lock(path: Path | None) -> Iterator[None]:
    """An exclusive ``fcntl.flock`` on ``<cache file>.lock`` for the measure-and-store: concurrent first plans (a
    sweep's runs starting together) queue on it, and each one after the first finds the first's record instead of
    timing under the first's load and storing a choice of its own. Where the file system refuses the lock the block
    runs unlocked; the re-read before the write (:func:`measured_choice`) still keeps the first stored record."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        handle = open(path.with_name(path.name + ".lock"), "a+", encoding="utf-8")  # noqa: SIM115 (held for the block)
    except OSError:
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:
            pass
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def measured_choice(shapes: list[tuple[int, int]], cache_dir: str | os.PathLike[str] | None, *,
                    timer: Timer | None = None) -> tuple[str, str]:
    """(precision, why) for Muon's Newton-Schulz over ``shapes`` on this CPU: the cached measurement of this
    machine and shapes, else ``timer``'s (default :func:`measure`; written atomically to ``cache_dir/ns_precision.json``,
    kept in the process when ``cache_dir`` is None). The first record stored wins: a measurement that finds a record
    written meanwhile by a concurrent process drops its own and uses the stored one, so every run of a sweep makes the
    same choice. ``why`` names both timings, the accuracy check and where the measurement lives."""
    machine, key = machine_key(), shapes_key(shapes)
    path = Path(cache_dir) / CACHE_FILE if cache_dir is not None else None
    where = f"cached in {path}" if path is not None else "kept in this process"
    record = _MEMO.get((machine, key)) or _stored(path, machine, key)
    if record is None:
        with _writer_lock(path):
            record = _stored(path, machine, key)  # stored by a process that held the lock before us
            if record is not None:
                where = f"measured by a concurrent process, {where}"
            else:
                mine = {**(timer or measure)(shapes), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
                record = _store(path, machine, key, mine) if path is not None else mine
                where = f"measured now, {where}" if record is mine else f"measured by a concurrent process, {where}"
    _MEMO[(machine, key)] = record
    precision, why = choose(record)
    return precision, f"auto: measured Newton-Schulz on this run's matrices ({key}; {machine}): {why} [{where}]"


def _store(path: Path, machine: str, key: str, record: dict[str, Any]) -> dict[str, Any]:
    """Write ``record`` under (machine, key) unless a record is there already (a writer that did not hold the lock);
    return the one that stays. Other machines' and shapes' entries are kept; the write is atomic (write, rename)."""
    data = _read(path)
    stored = _entry(data, machine, key)
    if stored is not None:
        return stored
    entries = data.get(machine)
    data[machine] = {**(entries if isinstance(entries, dict) else {}), key: record}
    write_json_atomic(path, data)
    return record
