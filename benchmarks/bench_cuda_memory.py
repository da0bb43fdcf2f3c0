"""CUDA memory of real training steps against the memory planner: optimizer state exactly, peak allocated as a
ratio (the planner's check on the device it plans for).

For each size x optimizer (default gpt2, gpt2-medium x adamw, lion, muon), in this process one after another:
build the model from scratch on the GPU (fp32 parameters, SDPA, embedding padded to 50,304 rows as a run builds
it), build the optimizer with its cited defaults, and run ``--steps`` training steps in the Trainer's order
(bf16 autocast forward, backward, ``clip_grad_norm_(1.0)``, ``step``, ``zero_grad(set_to_none=True)``) on one
micro-batch of random tokens. Then it compares:

- optimizer state: ``measure.state_bytes.optimizer_state_bytes`` (real storages) against
  ``plan_memory(...).optimizer_state_bytes`` (``precision="bf16"``: Trainer's mixed precision keeps fp32 state).
  Any difference is a planner bug, listed under the table;
- peak: ``torch.cuda.max_memory_allocated()`` over the steps (the statistics reset after the previous row's
  tensors are freed) against the planner's params + grads + state + activations. The planner leaves out the
  optimizer step's temporaries, autocast's bf16 weight copies and cuBLAS workspaces, and plans a 10 % margin
  for them; the ratio says how much of that margin a real step uses.

    python benchmarks/bench_cuda_memory.py [--sizes gpt2 gpt2-medium] [--optimizers adamw lion muon] \
        [--micro-batch 8] [--block 1024] [--json OUT]
    python benchmarks/bench_cuda_memory.py --device cpu --sizes tiny --micro-batch 2 --block 64   # the code path

Without CUDA (and no ``--device cpu``) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import warnings
from typing import Any

import torch

VOCAB = 50_266  # flax-community/gpt2-base-thai's tokenizer length; build_model pads it to 50,304 rows
GIB = 2**30


def _sync_peak(device: str) -> int | None:
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def measure_row(size: str, optimizer: str, *, micro_batch: int, block: int, steps: int, device: str) -> dict[str, Any]:
    """One size x optimizer: build, step, measure; every tensor it made is freed before it returns."""
    from hf_optbench.measure import state_bytes as SB
    from hf_optbench.measure.planner import plan_memory
    from hf_optbench.models import build_model
    from hf_optbench.optim.registry import build_optimizer

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    torch.manual_seed(0)
    model = build_model(size, VOCAB, n_positions=block).to(device)
    model.train()
    params = list(model.parameters())
    after_build = torch.cuda.memory_allocated() - base if device == "cuda" else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = build_optimizer(optimizer, model, model_size=size)
    if callable(getattr(opt, "train", None)):
        opt.train()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (micro_batch, block), generator=g).to(device)
    losses = []
    for _ in range(steps):
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    peak = _sync_peak(device)
    state = SB.optimizer_state_bytes(opt, params)
    rows = model.get_input_embeddings().num_embeddings
    plan = plan_memory(size, optimizer, precision="bf16", micro_batch_size=micro_batch, block_size=block,
                       vocab_size=rows, n_positions=block)
    planned_peak = plan.param_bytes + plan.grad_bytes + plan.optimizer_state_bytes + plan.activation_bytes
    row = {
        "size": size, "optimizer": optimizer, "num_params": SB.count_unique_params(params),
        "micro_batch": micro_batch, "block": block, "steps": steps, "losses": [round(v, 4) for v in losses],
        "measured_state_bytes": state.total, "planned_state_bytes": plan.optimizer_state_bytes,
        "state_exact": state.total == plan.optimizer_state_bytes,
        "planned_params_grads_state_act_bytes": planned_peak,
        "planned_activation_bytes": plan.activation_bytes,
        "allocated_after_build_bytes": after_build,
        "max_allocated_bytes": None if peak is None else peak - base,
        "peak_over_plan": None if peak is None else round((peak - base) / planned_peak, 4),
        "plan_fits": plan.fits,
    }
    del model, params, opt, x, loss, state
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def _gib(v: int | None) -> str:
    return "-" if v is None else f"{v / GIB:.2f}"


def format_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| size | optimizer | micro-batch x block | measured state GiB | planned state GiB | state exact | "
             "planned params+grads+state+act GiB | max allocated GiB | measured / planned |",
             "|---|---|---|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['size']} | {r['optimizer']} | - | - | - | - | - | - | failed: {r['error']} |")
            continue
        lines.append(f"| {r['size']} | {r['optimizer']} | {r['micro_batch']} x {r['block']} | "
                     f"{_gib(r['measured_state_bytes'])} | {_gib(r['planned_state_bytes'])} | "
                     f"{'yes' if r['state_exact'] else 'NO'} | {_gib(r['planned_params_grads_state_act_bytes'])} | "
                     f"{_gib(r['max_allocated_bytes'])} | {r['peak_over_plan'] if r['peak_over_plan'] else '-'} |")
    return lines


def _dump(path: str, device: str, rows: list[dict[str, Any]]) -> None:
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"device": name, "torch": torch.__version__, "rows": rows}, fh, indent=1)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["gpt2", "gpt2-medium"])
    ap.add_argument("--optimizers", nargs="+", default=["adamw", "lion", "muon"])
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3, help="steps per row (the first allocates the state)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--json", help="write the rows to this JSON file")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("skipped: no CUDA device (this benchmark compares CUDA peak memory with the planner; --device cpu "
              "runs its code path)")
        return 0
    rows = []
    for size in a.sizes:
        for name in a.optimizers:
            try:
                rows.append(measure_row(size, name, micro_batch=a.micro_batch, block=a.block, steps=a.steps,
                                        device=a.device))
            except Exception as exc:  # one failed row must not lose the others' figures
                rows.append({"size": size, "optimizer": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
                gc.collect()
                if a.device == "cuda":
                    torch.cuda.empty_cache()
            if a.json:  # after every row: a time limit that stops the next keeps this one
                _dump(a.json, a.device, rows)
            print(" | ".join(str(rows[-1].get(k)) for k in ("size", "optimizer", "measured_state_bytes",
                                                             "planned_state_bytes", "peak_over_plan", "error")),
                  file=sys.stderr, flush=True)
    device = torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu"
    print(f"torch {torch.__version__}; {device}")
    print("\n".join(format_table(rows)))
    bad = [r for r in rows if "error" not in r and not r["state_exact"]]
    for r in bad:
        print(f"planner mismatch: {r['size']} {r['optimizer']}: measured {r['measured_state_bytes']:,} B, planned "
              f"{r['planned_state_bytes']:,} B")
    return 1 if bad or any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
