"""Cost of one ``optimizer.step()`` on GPT-2 124M's parameter set, per optimizer implementation (issue 8, item 3).

No forward/backward: the parameters of a real ``GPT2LMHeadModel`` (gpt2 shape, vocab padded to 50,304, tied
head) get fixed random gradients, and each optimizer from ``hf_optbench.optim.registry.build_optimizer`` steps on
them. Reported per row: median seconds per step after warm-up steps, and optimizer-state bytes per parameter
(every tensor in ``optimizer.state``, quantisation maps and absmax included). One process, optimizers built one
after another (state bytes are exact; they do not depend on allocator history).

The Lion rows separate algorithm from implementation: ``lion_pytorch.Lion`` updates tensor by tensor,
``lion_pytorch.foreach.Lion`` runs the same rule (Chen et al. 2023, Alg. 2: c = b1*m + (1-b1)*g;
p -= lr*(sign(c) + wd*p); m = b2*m + (1-b2)*g) with torch._foreach ops. The script first checks that the two
agree (a few steps on the first two blocks; they differ only by float rounding of lerp vs mul+add). The
``adamw_8bit_emb8`` row is bitsandbytes with 8-bit embedding state too (``embedding_state_32bit=False``):
GPT-2's tied embedding is its largest matrix, so that one switch decides most of the 8-bit saving.

    python benchmarks/bench_optimizer_step.py                  # all rows, 3 timed steps (muon: 1), ~3 min idle
    python benchmarks/bench_optimizer_step.py --steps 1        # quicker
    python benchmarks/bench_optimizer_step.py --only adamw_fused lion lion_foreach --json out.json
    python benchmarks/bench_optimizer_step.py --device cuda    # on a GPU (adds the paged 8-bit rows)
    python benchmarks/bench_optimizer_step.py --threads 1      # on a shared/loaded CPU: 2 intra-op threads made
                                                               # steps 2-8x slower and noisy there
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import warnings

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from hf_optbench.optim.registry import build_optimizer, describe_optimizer
from hf_optbench.optim.spec import param_groups

# row -> (registry name, extra kwargs)
ROWS: dict[str, tuple[str, dict]] = {
    "adamw_foreach": ("adamw", {"fused": False, "foreach": True}),
    "adamw_fused": ("adamw", {"fused": True}),
    "lion": ("lion", {}),
    "lion_foreach": ("lion_foreach", {}),
    "adafactor": ("adafactor", {}),
    "adamw_8bit": ("adamw_8bit", {}),
    "adamw_8bit_emb8": ("adamw_8bit", {"embedding_state_32bit": False}),
    "lion_8bit": ("lion_8bit", {}),
    "sgd_nesterov": ("sgd", {}),
    "schedule_free_adamw": ("schedule_free_adamw", {}),
    "sophia": ("sophia", {}),
    "muon": ("muon", {}),
}
CUDA_ROWS: dict[str, tuple[str, dict]] = {
    "paged_adamw_8bit": ("paged_adamw_8bit", {}),
    "paged_lion_8bit": ("paged_lion_8bit", {}),
}


def gpt2_124m(device: str) -> GPT2LMHeadModel:
    cfg = GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab_size=50304, n_positions=1024, use_cache=False)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).to(device)
    g = torch.Generator(device=device).manual_seed(1)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g, device=device) * 1e-3
    return model


def state_bytes(opt: torch.optim.Optimizer) -> int:
    total = 0
    for st in opt.state.values():
        for v in st.values():
            if torch.is_tensor(v):
                total += v.numel() * v.element_size()
    return total


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_steps(opt: torch.optim.Optimizer, device: str, warmup: int, steps: int) -> list[float]:
    if callable(getattr(opt, "train", None)):
        opt.train()
    for _ in range(warmup):
        opt.step()
    _sync(device)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times


def check_lion_foreach(device: str) -> dict:
    """lion_pytorch.Lion vs lion_pytorch.foreach.Lion on the first two GPT-2 blocks (+ embeddings), 5 steps."""
    from lion_pytorch import Lion
    from lion_pytorch.foreach import Lion as LionForeach

    cfg = GPT2Config(n_layer=2, n_head=12, n_embd=768, vocab_size=50304, n_positions=1024, use_cache=False)
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(GPT2LMHeadModel(cfg).to(device))
    opts = [Lion(param_groups(models[0], 0.3), lr=2e-4), LionForeach(param_groups(models[1], 0.3), lr=2e-4)]
    g = torch.Generator(device=device).manual_seed(2)
    for _ in range(5):
        grads = [torch.randn(p.shape, generator=g, device=device) * 1e-3 for p in models[0].parameters()]
        for m, o in zip(models, opts, strict=False):
            for p, gr in zip(m.parameters(), grads, strict=False):
                p.grad = gr.clone()
            o.step()
    n = diff = 0
    max_abs = 0.0
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=False):
        d = (a - b).detach().abs()
        n += a.numel()
        diff += int((d > 1e-7).sum())
        max_abs = max(max_abs, float(d.max()))
    return {"elements": n, "differing_over_1e-7": diff, "max_abs_diff": max_abs, "lr": 2e-4, "steps": 5}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="timed steps per optimizer (median reported)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first (state allocation, first calls)")
    ap.add_argument("--muon-steps", type=int, default=1, help="timed steps for muon (Newton-Schulz is slow on CPU)")
    ap.add_argument("--only", nargs="*", help=f"rows to run: {', '.join(list(ROWS) + list(CUDA_ROWS))}")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = dict(ROWS)
    if args.device.startswith("cuda"):
        rows.update(CUDA_ROWS)
    if args.only:
        unknown = set(args.only) - set(rows)
        if unknown:
            ap.error(f"unknown rows {sorted(unknown)}; choose from {', '.join(rows)}")
        rows = {k: v for k, v in rows.items() if k in args.only}

    started = time.time()
    lion_check = check_lion_foreach(args.device) if {"lion", "lion_foreach"} & set(rows) else None
    model = gpt2_124m(args.device)
    n_params = sum(p.numel() for p in model.parameters())
    snapshot = [p.detach().clone() for p in model.parameters()]
    results = []
    for row, (name, kwargs) in rows.items():
        with torch.no_grad():  # same starting weights for every row
            for p, s in zip(model.parameters(), snapshot, strict=False):
                p.copy_(s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt = build_optimizer(name, model, model_size="gpt2", **kwargs)
            steps = args.muon_steps if name == "muon" else args.steps
            warm = args.warmup
            times = time_steps(opt, args.device, warm, steps)
        results.append({"row": row, "implementation": describe_optimizer(opt, model=model),
                        "median_s": statistics.median(times), "min_s": min(times), "steps": steps,
                        "state_bytes": state_bytes(opt), "state_bytes_per_param": state_bytes(opt) / n_params})
        print(f"  {row}: {results[-1]['median_s']:.3f} s/step", file=sys.stderr, flush=True)
        del opt
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()

    dev = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else \
        f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    print(f"\n### optimizer.step() on GPT-2 124M's parameters ({n_params / 1e6:.1f}M, fp32) -- {dev}, "
          f"torch {torch.__version__}\n")
    print("| row | implementation | median s/step | vs adamw fused | state B/param |")
    print("|---|---|---:|---:|---:|")
    base = next((r["median_s"] for r in results if r["row"] == "adamw_fused"), None)
    for r in results:
        rel = f"{r['median_s'] / base:.1f}x" if base else "-"
        print(f"| {r['row']} | `{r['implementation']}` | {r['median_s']:.3f} (n={r['steps']}) | {rel} | "
              f"{r['state_bytes_per_param']:.2f} |")
    if lion_check:
        print(f"\nlion_pytorch.foreach.Lion vs lion_pytorch.Lion after {lion_check['steps']} steps on "
              f"{lion_check['elements'] / 1e6:.1f}M weights: {lion_check['differing_over_1e-7']} elements differ by "
              f"> 1e-7, max |diff| {lion_check['max_abs_diff']:.2e} (one lr step = {lion_check['lr']:.0e}).")
    print(f"\n(total {time.time() - started:.0f} s)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"device": dev, "torch": torch.__version__, "num_params": n_params, "rows": results,
                       "lion_foreach_check": lion_check}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
