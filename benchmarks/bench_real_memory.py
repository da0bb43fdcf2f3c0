"""Optimizer-state bytes and peak RSS of real training steps at GPT-2's real sizes on CPU, beside the memory
planner's prediction for the same configuration (issue 12).

For each size (``gpt2`` 124M, ``gpt2-medium`` 355M, ``gpt2-large`` 774M) and each optimizer of the registry that
runs on CPU, one child process (``--one SIZE OPTIMIZER --json OUT``: allocator history of an earlier row would
skew peak RSS) builds the model from scratch (``build_model(size, 50257, n_positions=1024)``: embedding padded to
50,304 rows, tied head, fp32), builds the optimizer with its cited defaults (``build_optimizer(name, model,
model_size=size)``), and runs a few real training steps: forward + backward on micro-batch 1 x 64 random tokens,
``clip_grad_norm_(1.0)``, ``optimizer.step()``, ``zero_grad(set_to_none=True)`` (Trainer's order). Then:

- measured state bytes: ``hf_optbench.measure.metrics.optimizer_state_bytes`` (real storage of every tensor in
  the optimizer's state, each storage once), after the last step;
- planned state bytes: ``plan_memory(size, optimizer, precision="fp32", zero_stage=0, world_size=1,
  micro_batch_size=1, block_size=64, vocab_size=<the model's rows>, n_positions=1024).optimizer_state_bytes``;
  any difference between the two is a planner bug (the planner claims exactness) and is listed under the table;
- peak RSS: ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` in the child (whole process: torch runtime, model
  build, steps); RSS after build: ``VmRSS`` once the model is built, before the optimizer and the first step. The
  increment (peak - after build) holds the gradients, the optimizer state, activations and the step's
  temporaries; the planner's grads + state + activations are beside it.
- seconds per step: median of the steps after the first (the first allocates the state; SOAP's also computes its
  eigenbases), on ``--threads`` intra-op threads.

Optimizer state does not depend on the sequence length, so a short block keeps gpt2-large's steps at seconds. Sophia
runs its plain update only (its Hessian estimate comes every 10 steps in Trainer, after these few); schedule-free
AdamW is switched to train mode first. A row whose planned params + grads + state + activations (+ 1 GiB of
runtime) would not fit in the machine's available memory (less ``--reserve-gib``) is skipped with that reason, a
child is stopped if the machine's available memory falls below ``--reserve-gib`` or it runs past ``--timeout``
(what it measured by then is kept, marked partial), and the paged_* optimizers are skipped: they need CUDA.

    python benchmarks/bench_real_memory.py                                 # all CPU optimizers x 3 sizes, 3 steps
    python benchmarks/bench_real_memory.py --sizes gpt2 --only adamw lion  # part of it
    python benchmarks/bench_real_memory.py --sizes tiny --only adamw lion --steps 2   # smoke run (the test's)
    nice -n 10 python benchmarks/bench_real_memory.py --json real_memory.json > real_memory.md   # the README run
    python benchmarks/bench_real_memory.py --sizes gpt2-medium --only soap --timeout 2400   # SOAP's first step at
                                                   # 355M (eigh of every preconditioner) took 10 min on one thread
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = ("gpt2", "gpt2-medium", "gpt2-large")
GPT2_VOCAB = 50_257  # GPT-2's tokenizer; build_model pads the embedding to 50,304 rows (a multiple of 64)
N_POSITIONS = 1024  # GPT-2's context: the position embedding is part of the real parameter count
RUNTIME_OVERHEAD = 2**30  # python + torch + transformers RSS before any model (~0.6-0.8 GiB measured)
MIB = 2**20
GIB = 2**30


# --------------------------------------------------------------------------------------------------------------
# /proc helpers (Linux)
# --------------------------------------------------------------------------------------------------------------
def _proc_kb(field: str, path: str = "/proc/self/status") -> int | None:
    """A ``kB`` field of a /proc status/meminfo file (VmRSS, VmHWM, MemAvailable); None where unavailable."""
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def mem_available() -> int | None:
    kb = _proc_kb("MemAvailable", "/proc/meminfo")
    return None if kb is None else kb * 1024


def mem_total() -> int | None:
    kb = _proc_kb("MemTotal", "/proc/meminfo")
    return None if kb is None else kb * 1024


# --------------------------------------------------------------------------------------------------------------
# The child: one (size, optimizer) measurement in a fresh process
# --------------------------------------------------------------------------------------------------------------
def _write_json(path: str, obj: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1)
    os.replace(tmp, path)  # the parent may read it at any time (after a timeout): never half-written


def measure_one(size: str, optimizer: str, out: str, *, steps: int, block_size: int, threads: int,
                vocab_size: int) -> int:
    """Build, step ``steps`` times, write the measurement to ``out`` (rewritten after every step)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import warnings

    import torch

    from hf_optbench import build_model, build_optimizer, describe_optimizer
    from hf_optbench.measure import state_bytes as SB

    torch.set_num_threads(threads)
    rec: dict = {"size": size, "optimizer": optimizer, "steps_asked": steps, "block_size": block_size,
                 "threads": torch.get_num_threads(), "torch": torch.__version__,
                 "python": platform.python_version(), "rss_start_kb": _proc_kb("VmRSS")}
    torch.manual_seed(0)
    model = build_model(size, vocab_size, n_positions=N_POSITIONS)
    model.train()
    params = list(model.parameters())
    rec.update(num_params=SB.count_unique_params(params),
               vocab_rows=model.get_input_embeddings().num_embeddings,
               param_bytes=SB.params_storage_bytes(params),
               rss_after_build_kb=_proc_kb("VmRSS"),
               maxrss_after_build_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = build_optimizer(optimizer, model, model_size=size)
    rec["implementation"] = describe_optimizer(opt, model=model)  # updated after each step
    rec["rss_after_optimizer_build_kb"] = _proc_kb("VmRSS")
    if callable(getattr(opt, "train", None)):
        opt.train()  # schedule-free optimizers step only in train mode
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, min(vocab_size, GPT2_VOCAB), (1, block_size), generator=g)
    rec.update(step_seconds=[], losses=[], grad_bytes=None, state=None, steps_done=0)
    _write_json(out, rec)
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        if rec["grad_bytes"] is None:
            rec["grad_bytes"] = SB.grads_storage_bytes(params)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt.step()
        model.zero_grad(set_to_none=True)
        rec["step_seconds"].append(time.perf_counter() - t0)
        rec["losses"].append(float(loss.detach()))
        sb = SB.optimizer_state_bytes(opt, params)
        rec.update(steps_done=len(rec["step_seconds"]),
                   implementation=describe_optimizer(opt, model=model),  # after stepping: the state dtypes
                   state={"total": sb.total, "by_dtype": sb.by_dtype, "by_name": sb.by_name,
                          "num_tensors": sb.num_tensors, "master_bytes": sb.master_bytes},
                   maxrss_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                   vm_hwm_kb=_proc_kb("VmHWM"), rss_end_kb=_proc_kb("VmRSS"))
        _write_json(out, rec)
        print(f"    {size} {optimizer}: step {rec['steps_done']}/{steps} {rec['step_seconds'][-1]:.2f} s, "
              f"loss {rec['losses'][-1]:.3f}", file=sys.stderr, flush=True)
    return 0


# --------------------------------------------------------------------------------------------------------------
# The parent: plan, run each row in its own process, print the table
# --------------------------------------------------------------------------------------------------------------
def _plan(size: str, optimizer: str, block_size: int, vocab_size: int):
    from hf_optbench import plan_memory

    return plan_memory(size, optimizer, precision="fp32", zero_stage=0, world_size=1, micro_batch_size=1,
                       block_size=block_size, vocab_size=vocab_size, n_positions=N_POSITIONS)


def _phase(out: str, steps: int) -> str:
    """Where a child was when it was stopped, from the measurement it has written so far."""
    try:
        with open(out, encoding="utf-8") as fh:
            done = json.load(fh).get("steps_done", 0)
    except (OSError, ValueError):
        return "while building the model or the optimizer"
    return f"in step {done + 1} of {steps}"


def _run_child(size: str, optimizer: str, args: argparse.Namespace, workdir: str) -> tuple[dict | None, str]:
    """(the child's JSON or None, reason it stopped early or '') with a timeout and a free-memory watchdog."""
    out = os.path.join(workdir, f"{size}__{optimizer}.json")
    err_path = os.path.join(workdir, f"{size}__{optimizer}.stderr")
    cmd = [sys.executable, os.path.abspath(__file__), "--one", size, optimizer, "--json", out,
           "--steps", str(args.steps), "--block-size", str(args.block_size), "--threads", str(args.threads),
           "--vocab-size", str(args.vocab_size)]
    reason = ""
    started = time.monotonic()
    with open(err_path, "w", encoding="utf-8") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        while proc.poll() is None:
            time.sleep(0.5)
            avail = mem_available()
            if time.monotonic() - started > args.timeout:
                reason = f"stopped after {args.timeout:.0f} s (--timeout) {_phase(out, args.steps)}"
            elif avail is not None and avail < args.reserve_gib * GIB:
                child_rss = _proc_kb("VmRSS", f"/proc/{proc.pid}/status")
                reason = (f"stopped: machine's available memory fell to {avail / GIB:.1f} GiB "
                          f"(child RSS {0 if child_rss is None else child_rss / 2**20:.1f} GiB)")
            if reason:
                proc.kill()
                proc.wait()
                break
    rc = proc.returncode
    if not reason and rc != 0:
        tail = Path(err_path).read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:]
        killed = " (killed: out of memory?)" if rc in (-9, 137) else ""
        reason = f"exit {rc}{killed}: " + " | ".join(tail)
    rec = None
    if os.path.exists(out):
        with open(out, encoding="utf-8") as fh:
            rec = json.load(fh)
    return rec, reason


def _row(size: str, optimizer: str, args: argparse.Namespace, workdir: str, cuda_only: bool) -> dict:
    plan = _plan(size, optimizer, args.block_size, args.vocab_size)
    row: dict = {"size": size, "optimizer": optimizer, "num_params": plan.num_params,
                 "planned_state_bytes": plan.optimizer_state_bytes,
                 "planned_grads_state_act_bytes": plan.grad_bytes + plan.optimizer_state_bytes
                 + plan.activation_bytes,
                 "planned_total_bytes": plan.total_bytes, "status": "ok", "reason": ""}
    if cuda_only:
        row.update(status="skipped", reason="needs CUDA (paged optimizer state lives in CUDA unified memory)")
        return row
    need = plan.total_bytes + RUNTIME_OVERHEAD
    avail = mem_available()
    if avail is not None and need > avail - args.reserve_gib * GIB:
        row.update(status="skipped", reason=(
            f"planned params+grads+state+activations {plan.total_bytes / GIB:.1f} GiB (+1 GiB runtime) exceeds "
            f"this machine's available {avail / GIB:.1f} GiB less the {args.reserve_gib:g} GiB reserve"))
        return row
    t0 = time.monotonic()
    rec, reason = _run_child(size, optimizer, args, workdir)
    row["wall_s"] = time.monotonic() - t0
    row["child"] = rec
    if rec is None or not rec.get("steps_done"):
        row.update(status="skipped", reason=reason or "the child wrote no measurement")
        if rec is not None:
            row["implementation"] = rec.get("implementation")
        return row
    if rec["steps_done"] < args.steps:
        row.update(status="partial", reason=f"{rec['steps_done']} of {args.steps} steps; {reason}")
    elif reason:
        row.update(status="partial", reason=reason)
    if rec["vocab_rows"] != plan.vocab_size:  # plan exactly the model that ran
        plan = _plan(size, optimizer, args.block_size, rec["vocab_rows"])
        row.update(planned_state_bytes=plan.optimizer_state_bytes, planned_total_bytes=plan.total_bytes,
                   planned_grads_state_act_bytes=plan.grad_bytes + plan.optimizer_state_bytes
                   + plan.activation_bytes)
    secs = rec["step_seconds"]
    row.update(
        implementation=rec["implementation"],
        measured_num_params=rec["num_params"],
        measured_state_bytes=rec["state"]["total"],
        state_by_dtype=rec["state"]["by_dtype"],
        state_by_name=rec["state"]["by_name"],
        ratio=rec["state"]["total"] / row["planned_state_bytes"] if row["planned_state_bytes"] else None,
        state_bytes_per_param=rec["state"]["total"] / rec["num_params"],
        peak_rss_bytes=rec["maxrss_kb"] * 1024,
        vm_hwm_bytes=(rec["vm_hwm_kb"] or 0) * 1024,
        rss_after_build_bytes=rec["rss_after_build_kb"] * 1024,
        rss_start_bytes=rec["rss_start_kb"] * 1024,
        first_step_s=secs[0],
        s_per_step=statistics.median(secs[1:]) if len(secs) > 1 else secs[0],
        steps_done=rec["steps_done"],
    )
    return row


def _fmt_int(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def _fmt_mib(v: float | None) -> str:
    return "-" if v is None else f"{v / MIB:,.0f}"


def format_table(rows: list[dict]) -> list[str]:
    lines = [
        "| size | parameters | optimizer | implementation | measured state bytes | planned state bytes | "
        "measured/planned | state B/param | peak RSS MiB | RSS after build MiB | peak - build MiB | "
        "planned grads+state+act MiB | s/step (first) | status |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if "measured_state_bytes" not in r:
            lines.append(f"| {r['size']} | {_fmt_int(r['num_params'])} | {r['optimizer']} | "
                         f"{'`' + r['implementation'] + '`' if r.get('implementation') else '-'} | - | "
                         f"{_fmt_int(r['planned_state_bytes'])} | - | - | - | - | - | "
                         f"{_fmt_mib(r['planned_grads_state_act_bytes'])} | - | skipped: {r['reason']} |")
            continue
        status = "ok" if r["status"] == "ok" else f"partial: {r['reason']}"
        lines.append(
            f"| {r['size']} | {_fmt_int(r['measured_num_params'])} | {r['optimizer']} | `{r['implementation']}` | "
            f"{_fmt_int(r['measured_state_bytes'])} | {_fmt_int(r['planned_state_bytes'])} | "
            f"{r['ratio']:.4f} | {r['state_bytes_per_param']:.3f} | {_fmt_mib(r['peak_rss_bytes'])} | "
            f"{_fmt_mib(r['rss_after_build_bytes'])} | "
            f"{_fmt_mib(r['peak_rss_bytes'] - r['rss_after_build_bytes'])} | "
            f"{_fmt_mib(r['planned_grads_state_act_bytes'])} | {r['s_per_step']:.2f} ({r['first_step_s']:.2f}) | "
            f"{status} |")
    return lines


def mismatches(rows: list[dict]) -> list[str]:
    """One line per row whose measured state bytes differ from the planner's (each is a planner bug)."""
    out = []
    for r in rows:
        if "measured_state_bytes" in r and r["measured_state_bytes"] != r["planned_state_bytes"]:
            partial = " (partial row: fewer steps than asked)" if r["status"] != "ok" else ""
            out.append(f"{r['size']} {r['optimizer']}{partial}: measured {r['measured_state_bytes']:,} B, planned "
                       f"{r['planned_state_bytes']:,} B (difference {r['measured_state_bytes'] - r['planned_state_bytes']:+,} B, "
                       f"ratio {r['ratio']:.6f}); measured by name: {r['state_by_name']}; by dtype: {r['state_by_dtype']}")
        if "measured_num_params" in r and r["measured_num_params"] != r["num_params"]:
            out.append(f"{r['size']} {r['optimizer']}: the model has {r['measured_num_params']:,} parameters, the "
                       f"planner's shapes {r['num_params']:,}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), help=f"model sizes (default: {' '.join(SIZES)})")
    ap.add_argument("--only", nargs="+", help="optimizers to run (default: every registry optimizer)")
    ap.add_argument("--steps", type=int, default=3, help="training steps per row (default 3)")
    ap.add_argument("--block-size", type=int, default=64, help="tokens per micro-batch (default 64)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads in each child (default 1)")
    ap.add_argument("--vocab-size", type=int, default=GPT2_VOCAB, help="tokenizer length (padded to 64)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per row before it is stopped (600)")
    ap.add_argument("--reserve-gib", type=float, default=2.0,
                    help="available memory to leave to the rest of the machine (default 2 GiB)")
    ap.add_argument("--json", help="write the rows here (with --one: the child's measurement)")
    ap.add_argument("--one", nargs=2, metavar=("SIZE", "OPTIMIZER"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.block_size < 1 or args.threads < 1:
        ap.error("--steps, --block-size and --threads must be positive")
    if args.one:
        if not args.json:
            ap.error("--one needs --json OUT")
        return measure_one(*args.one, args.json, steps=args.steps, block_size=args.block_size,
                           threads=args.threads, vocab_size=args.vocab_size)

    from hf_optbench import GPT2_SIZES, OPTIMIZERS

    unknown_sizes = [s for s in args.sizes if s not in GPT2_SIZES]
    if unknown_sizes:
        ap.error(f"unknown sizes {unknown_sizes}; choose from {', '.join(GPT2_SIZES)}")
    names = list(OPTIMIZERS)
    if args.only:
        unknown = [o for o in args.only if o not in OPTIMIZERS]
        if unknown:
            ap.error(f"unknown optimizers {unknown}; choose from {', '.join(OPTIMIZERS)}")
        names = [o for o in names if o in args.only]

    started = time.monotonic()
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_real_memory_") as workdir:
        for size in args.sizes:
            for name in names:
                print(f"  {size} {name} ...", file=sys.stderr, flush=True)
                row = _row(size, name, args, workdir, OPTIMIZERS[name].requires_cuda)
                rows.append(row)
                got = (f"state {row['measured_state_bytes']:,} B (planned {row['planned_state_bytes']:,}), "
                       f"peak RSS {row['peak_rss_bytes'] / MIB:,.0f} MiB, {row.get('wall_s', 0):.0f} s"
                       if "measured_state_bytes" in row else "")
                print(f"  {size} {name}: {row['status']} {got} {row['reason']}", file=sys.stderr, flush=True)
    total = time.monotonic() - started

    child = next((r["child"] for r in rows if r.get("child")), {}) or {}
    total_ram = mem_total()
    print(f"### Optimizer state and peak RSS of real training steps on CPU, beside the planner ({when})\n")
    print(f"{platform.machine()} CPU, {os.cpu_count()} cores, "
          f"{'?' if total_ram is None else f'{total_ram / GIB:.1f} GiB'} RAM; torch {child.get('torch', '?')}, "
          f"python {platform.python_version()}, {args.threads} intra-op thread(s) per child; fp32, micro-batch 1 x "
          f"{args.block_size} tokens, vocab {args.vocab_size} padded to 64, n_positions {N_POSITIONS}; "
          f"{args.steps} steps per row, one process per row.\n")
    print("\n".join(format_table(rows)))
    bad = mismatches(rows)
    print()
    if bad:
        print("**Measured != planned optimizer-state bytes (planner bugs):**\n")
        print("\n".join(f"- {b}" for b in bad))
    else:
        measured = sum("measured_state_bytes" in r for r in rows)
        print(f"Measured optimizer-state bytes equal the planner's in all {measured} measured rows.")
    hwm_off = [r for r in rows if r.get("vm_hwm_bytes") and abs(r["vm_hwm_bytes"] - r["peak_rss_bytes"])
               > 0.01 * r["peak_rss_bytes"]]
    for r in hwm_off:
        print(f"\nnote: {r['size']} {r['optimizer']}: ru_maxrss {r['peak_rss_bytes'] / MIB:,.0f} MiB but VmHWM "
              f"{r['vm_hwm_bytes'] / MIB:,.0f} MiB (ru_maxrss can carry the parent's peak across exec)")
    print(f"\n(total {total:.0f} s = {total / 60:.1f} min)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"date": when, "machine": {"arch": platform.machine(), "cpus": os.cpu_count(),
                                                 "ram_bytes": total_ram},
                       "torch": child.get("torch"), "python": platform.python_version(), "threads": args.threads,
                       "steps": args.steps, "block_size": args.block_size, "vocab_size": args.vocab_size,
                       "total_s": total, "rows": rows, "mismatches": bad}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
