"""Memory probe: optimizer-state, parameter and gradient storage, peak memory, totals over ranks.

Measured after the first optimizer step of every ``train()`` call (the state exists and is sized then, also
after a resume) and again at train end, never per step: real storage of the optimizer state
(``state_bytes.optimizer_state_bytes``: untyped storages deduplicated, tensor subclasses flattened), by dtype,
state name and device; params and grads (grads only exist between backward and ``zero_grad``, hence after the
optimizer step). The optimizer the Trainer hands over is unwrapped through ``.optimizer`` (Accelerate, DeepSpeed
ZeRO 1-3): under ZeRO the innermost optimizer was built on this rank's flat fp32 partition, so its state is the
partition this rank holds, and that partition itself is ``optimizer_master_bytes``. Totals over ranks go through
``torch.distributed.all_gather_object`` when a process group is up.

Peak memory: CUDA ``max_memory_allocated``/``max_memory_reserved`` after ``reset_peak_memory_stats`` at train
begin (kind ``cuda_max_allocated``); on CPU the process's peak RSS (kind ``cpu_peak_rss``), reset at train begin
through ``/proc/self/clear_refs`` on Linux (``peak_memory_since: "train_begin"``), else ``ru_maxrss`` since the
process started (``"process_start"``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hf_optbench.measure.probe_base import Probe, RunContext
from hf_optbench.measure.state_bytes import (
    count_unique_params,
    grads_storage_bytes,
    optimizer_state_bytes,
    params_storage_bytes,
)

if TYPE_CHECKING:
    import torch
    from transformers import TrainerState, TrainingArguments

PEAK_KEYS = ("peak_memory_bytes", "peak_memory_kind", "cuda_max_reserved_bytes", "peak_memory_since",
             "peak_memory_bytes_per_rank")
# summary keys taken from the memory rows, in summary order
_STATE_KEYS = ("optimizer_state_bytes", "optimizer_state_bytes_total", "optimizer_state_bytes_per_param",
               "optimizer_state_bytes_by_dtype", "optimizer_state_bytes_by_name", "optimizer_state_bytes_by_device",
               "optimizer_master_bytes", "param_bytes")
# figures of the first-step measurement forwarded to report_to backends
_LOGGED = ("optimizer_state_bytes", "optimizer_state_bytes_total", "optimizer_state_bytes_per_param",
           "param_bytes", "grad_bytes")


def gather(obj: Any) -> list[Any]:
    """[obj of rank 0, rank 1, ...] when a process group is up, else [obj]. Every rank must call it."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out
    return [obj]


def reset_peak_memory(device: Any) -> str:
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


def read_peak_memory(device: Any) -> dict[str, Any]:
    """Peak memory since the window started: CUDA allocator peaks on a GPU, else the process's peak RSS."""
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


def param_bytes(params: list[Any]) -> int:
    """Storage of the model's parameters on this rank; ZeRO-3 keeps each one's partition in ``ds_tensor``."""
    return params_storage_bytes(getattr(p, "ds_tensor", p) for p in params)


class MemoryProbe(Probe):
    """Writes the ``memory`` rows (first step, train end) and the memory keys of the summary."""

    def __init__(self) -> None:
        self.peak_since = "process_start"
        self._first: dict[str, Any] = {}  # the last first-step measurement (kept across a resume)
        self._end: dict[str, Any] = {}  # the train-end measurement of this call
        self._measured_this_call = False
        self._pending: dict[str, Any] = {}

    def on_train_begin(self, ctx: RunContext, args: TrainingArguments, model: torch.nn.Module) -> None:
        self._first, self._end, self._pending = {}, {}, {}
        self._measured_this_call = False
        self.peak_since = reset_peak_memory(ctx.device)

    def replay(self, rows: Sequence[dict[str, Any]]) -> None:
        for row in rows:
            if row.get("kind") == "memory":
                self._first = {k: v for k, v in row.items() if k not in ("kind", "when")}

    def on_optimizer_step(self, ctx: RunContext, state: TrainerState, optimizer: Any,
                          model: torch.nn.Module) -> list[dict[str, Any]]:
        if not ctx.bench.measure_memory or self._measured_this_call or optimizer is None:
            return []
        self._measured_this_call = True
        t = time.perf_counter()
        row = self.measure(ctx, optimizer, model, state.global_step + 1, "first_step")
        self._first = row
        self._pending = {k: row[k] for k in _LOGGED if row.get(k) is not None}
        # a one-off walk (and all-gather): neither step time nor training time
        ctx.clock.exclude(time.perf_counter() - t)
        return [{"kind": "memory", **row}]

    def on_log(self, ctx: RunContext, logs: Mapping[str, Any]) -> dict[str, Any]:
        pending, self._pending = self._pending, {}
        return pending

    def final_logs(self, ctx: RunContext) -> dict[str, Any]:
        peak = read_peak_memory(ctx.device)["peak_memory_bytes"] if ctx.in_train else None
        return {"peak_memory_bytes": peak}

    def on_train_end(self, ctx: RunContext, state: TrainerState, optimizer: Any,
                     model: torch.nn.Module) -> list[dict[str, Any]]:
        if not ctx.bench.measure_memory or optimizer is None:
            return []
        self._end = self.measure(ctx, optimizer, model, state.global_step, "train_end")
        return [{"kind": "memory", **self._end}]

    def measure(self, ctx: RunContext, optimizer: Any, model: torch.nn.Module, step: int,
                when: str) -> dict[str, Any]:
        """One memory row (without ``kind``); every rank must call it (all-gather)."""
        grads, end = when == "first_step", when == "train_end"
        params = list(model.parameters()) if model is not None else []
        state = optimizer_state_bytes(optimizer, params)
        num_params = count_unique_params(params)
        local: dict[str, Any] = {"state": state.total, "params": param_bytes(params),
                                 "grads": grads_storage_bytes(params) if grads else None}
        if end:
            local.update(read_peak_memory(ctx.device))
        ranks = gather(local)
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
        if end:
            row.update({k: local[k] for k in PEAK_KEYS[:3]})
            row["peak_memory_since"] = self.peak_since
            row["peak_memory_bytes_per_rank"] = [r["peak_memory_bytes"] for r in ranks]
        return row

    def summary(self, ctx: RunContext) -> dict[str, Any]:
        mem = {**self._first, **{k: v for k, v in self._end.items() if v is not None}}
        peak = {k: mem.get(k) for k in PEAK_KEYS}
        if peak["peak_memory_bytes"] is None and ctx.in_train:
            peak.update(read_peak_memory(ctx.device), peak_memory_since=self.peak_since)
        return {**{k: mem.get(k) for k in _STATE_KEYS}, "grad_bytes": self._first.get("grad_bytes"), **peak}
