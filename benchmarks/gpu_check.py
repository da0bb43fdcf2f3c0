"""The Python half of ``benchmarks/gpu_check.sh``: the steps that are more than one command, and the collector.

    python benchmarks/gpu_check.py env OUT.json               # versions, device
    python benchmarks/gpu_check.py tests OUT.json             # the gpu-marked tests, outcomes by test
    python benchmarks/gpu_check.py resume WORK OUT.json       # gpt2 eager, 20 steps, a checkpoint at 10, a resume
    python benchmarks/gpu_check.py zero WORK OUT.json         # ZeRO-2 on one GPU with hf_optbench's Lion
    python benchmarks/gpu_check.py headline WORK OUT.json     # the headline recipe, compiled, ~30 steps, timed
    python benchmarks/gpu_check.py collect WORK OUTDIR        # WORK's steps.tsv + step JSONs -> OUTDIR/gpu_check.json

``--rehearse`` (resume, zero, headline) runs the same code path on the CPU at a toy shape (``tiny``, fp32, no
compile): a check of the script before a GPU is lent, never a measurement.

Every run uses data generated here in the c4 layout that ``allenai/c4`` config ``th`` has on the Hub (documents
recombined from the bundled Thai sample's sentences, read through the same json builder as the Hub's files) and
the bundled tokenizer ``builtin:thai-bpe-2k`` (the Hub's ``flax-community/gpt2-base-thai`` cannot be fetched on
the GPU machine: 2,048 rows instead of 50,304 in the embedding).

* headline: ``accelerate launch -m hf_optbench.run recipes/lion_gpt2_large.yaml`` on one GPU as the recipe says
  (gpt2-large, Lion, bf16, ``torch.compile``, block 1024), ~30 steps at the largest micro-batch the memory planner
  fits on the device (:func:`largest_micro_batch`; 32 on an 80 GB H100, and at most 32), no gradient accumulation,
  no checkpoint and no evaluation
  (``eval_strategy no``): its tokens/s and MFU are the figures, so nothing else runs in its time.
* resume: ``recipes/lion_gpt2.yaml`` eager (no compile: its time is the resume's, not a compiler's), 20 steps with
  a checkpoint at 10, then a second run resumes from checkpoint-10 into another directory: the plan's identity
  stamped in the checkpoint is checked by the run itself (a mismatch exits 2), and the losses of steps 11-20 are
  compared.
* zero: ``recipes/lion_gpt2.yaml`` through accelerate's DeepSpeed ZeRO-2 plugin on one GPU (DeepSpeed wraps
  hf_optbench's Lion), 20 steps.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
THAI_SAMPLE = ROOT / "hf_optbench" / "resources" / "thai" / "thai_sample.jsonl"
HEADLINE = "recipes/lion_gpt2_large.yaml"
ZERO_RECIPE = "recipes/lion_gpt2.yaml"
ZERO_CONFIG = "accelerate_configs/a100x4_zero2.yaml"
TOKENIZER = "builtin:thai-bpe-2k"
STEPS_FILE = "steps.tsv"  # gpu_check.sh appends: name, exit code, seconds, time limit
RESULT_FILE = "gpu_check.json"


def _write(path: str | Path, obj: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1, default=str)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------------- env
def env(out: str) -> int:
    info: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine(),
                            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "versions": {}}
    for name in ("torch", "transformers", "accelerate", "datasets", "evaluate", "tokenizers", "huggingface_hub",
                 "lion_pytorch", "schedulefree", "pytorch_optimizer", "bitsandbytes", "deepspeed", "pyarrow",
                 "fsspec", "numpy", "triton"):
        try:
            mod = __import__(name)
            info["versions"][name] = getattr(mod, "__version__", "?")
        except Exception as exc:  # noqa: BLE001  (a package that fails to import is itself a finding)
            info["versions"][name] = f"not importable: {type(exc).__name__}: {str(exc)[:160]}"
    import torch

    info["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(device=torch.cuda.get_device_name(0), device_memory_bytes=p.total_memory,
                    multiprocessors=p.multi_processor_count, capability=f"{p.major}.{p.minor}")
    _write(out, info)
    print(json.dumps(info, indent=1))
    return 0


# ------------------------------------------------------------------------------------------------------ data
def make_c4_layout(directory: Path, train_chars: int, valid_chars: int, seed: int = 0) -> dict[str, Any]:
    """Write ``c4-th.*.json.gz`` and ``c4-th-validation.*.json.gz`` (text, timestamp, url: the Hub's columns) of
    documents recombined from the bundled Thai sample's sentences (seeded: the same files every time)."""
    sentences = []
    for line in THAI_SAMPLE.read_text(encoding="utf-8").splitlines():
        if line.strip():
            sentences += [s for s in json.loads(line)["text"].split(" ") if s.strip()]
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, chars in (("c4-th.tfrecord-00000-of-00001.json.gz", train_chars),
                        ("c4-th-validation.tfrecord-00000-of-00001.json.gz", valid_chars)):
        n_docs, total = 0, 0
        with gzip.open(directory / name, "wt", encoding="utf-8") as fh:
            while total < chars:
                text = " ".join(rng.choice(sentences) for _ in range(rng.randint(8, 40)))
                fh.write(json.dumps({"text": text, "timestamp": "2020-01-01T00:00:00Z",
                                     "url": f"https://example.invalid/{name.split('.')[0]}/{n_docs}"},
                                    ensure_ascii=False) + "\n")
                n_docs, total = n_docs + 1, total + len(text)
        written[name] = {"documents": n_docs, "characters": total}
    return written


def _chars_per_token() -> float:
    from hf_optbench.data.tokenizers import load_tokenizer

    tok = load_tokenizer(TOKENIZER)
    text = " ".join(json.loads(line)["text"] for line in THAI_SAMPLE.read_text(encoding="utf-8").splitlines()
                    if line.strip())
    return len(text) / len(tok(text)["input_ids"])


# --------------------------------------------------------------------------------------------------- running
def _launch(args: list[str], log: Path, timeout: float) -> dict[str, Any]:
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    cmd = [accelerate, "launch", *args]
    t0 = time.monotonic()
    with open(log, "w", encoding="utf-8") as fh:
        fh.write(" ".join(cmd) + "\n")
        fh.flush()
        # its own process group: on a timeout the launcher's workers go too, and free the GPU for the next launch
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                                         TOKENIZERS_PARALLELISM="false", WANDB_MODE="disabled"))
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = 124
    tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
    return {"command": " ".join(cmd), "rc": rc, "wall_s": round(time.monotonic() - t0, 1), "log_tail": tail}


def _losses(run_dir: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line) if line.strip() else {}
        if "loss" in row and "step" in row:
            out[int(row["step"])] = float(row["loss"])
    return out


SUMMARY_KEYS = ("status", "steps", "model_size", "optimizer", "optimizer_impl", "num_params", "embedding_rows",
                "precision", "world_size", "tokens_per_step", "micro_batch_size", "gradient_accumulation_steps",
                "tokens_per_s", "step_time_median_s", "step_time_p90_s", "mfu", "device_name",
                "device_peak_flops", "flops_per_token", "startup_s", "train_runtime_s", "peak_memory_bytes",
                "peak_memory_kind", "cuda_max_reserved_bytes", "optimizer_state_bytes",
                "optimizer_state_bytes_total", "param_bytes", "grad_bytes", "final_train_loss", "final_eval_loss",
                "train_segments")


def _summary(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "summary.json"
    if not path.exists():
        return None
    s = json.loads(path.read_text(encoding="utf-8"))
    return {k: s.get(k) for k in SUMMARY_KEYS}


def _plan(size: str, optimizer: str, summary: dict[str, Any], zero_stage: int = 0) -> dict[str, Any]:
    from hf_optbench.measure.planner import plan_memory

    precision = "bf16" if summary.get("precision") == "bf16" else "fp32"
    p = plan_memory(size, optimizer, precision=precision, zero_stage=zero_stage, world_size=1,
                    micro_batch_size=int(summary["micro_batch_size"]), block_size=BLOCK,
                    vocab_size=int(summary["embedding_rows"]), n_positions=BLOCK)
    peak = summary.get("peak_memory_bytes")
    return {"planned_state_bytes": p.optimizer_state_bytes, "planned_total_bytes": p.total_bytes,
            "measured_state_bytes": summary.get("optimizer_state_bytes"),
            "state_exact": summary.get("optimizer_state_bytes") == p.optimizer_state_bytes,
            "peak_over_plan": round(peak / p.total_bytes, 4) if peak and summary.get(
                "peak_memory_kind") == "cuda_max_allocated" else None}


BLOCK = 1024
RESUME_RECIPE = "recipes/lion_gpt2.yaml"
# measured peak allocated over the planner's total at gpt2-large, Lion, bf16, micro-batch 4 (1.1633, H100,
# benchmarks/results/gpu_check_h100.md): the planner leaves out the step's temporary buffers, so the headline's
# micro-batch is chosen with this much room beyond the planner's own margin (FIT_MARGIN)
PEAK_OVER_PLAN = 1.2


def largest_micro_batch(size: str, optimizer: str, vocab_size: int, capacity_bytes: int, limit: int = 256) -> int:
    """The largest power-of-two micro-batch whose planned memory (x PEAK_OVER_PLAN) stays within the planner's
    fit margin of ``capacity_bytes`` (1 if none does): no search by trial, which cost the MFU step 50 s before."""
    from hf_optbench.measure.planner import FIT_MARGIN, plan_memory

    best = 1
    micro = 1
    while micro <= limit:
        plan = plan_memory(size, optimizer, precision="bf16", micro_batch_size=micro, block_size=BLOCK,
                           vocab_size=vocab_size, n_positions=BLOCK)
        if plan.total_bytes * PEAK_OVER_PLAN > FIT_MARGIN * capacity_bytes:
            break
        best, micro = micro, micro * 2
    return best


REHEARSAL = ["--model_size", "tiny", "--bf16", "false", "--torch_compile", "false", "--use_cpu", "true",
             "--block_size", "64", "--dataloader_num_workers", "0"]
REHEARSAL_LAUNCH = ["--cpu", "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no",
                    "--dynamo_backend", "no"]
GPU_LAUNCH = ["--num_processes", "1", "--num_machines", "1", "--mixed_precision", "bf16", "--dynamo_backend", "no"]


def _data_args(work: Path, tokens: int, seed: int = 0) -> tuple[list[str], dict[str, Any]]:
    """The c4-layout data for ``tokens`` training tokens (and 16 blocks of validation text), and the arguments
    that read it."""
    cpt = _chars_per_token()
    data = make_c4_layout(work / "data", train_chars=int(tokens * cpt * 1.3), valid_chars=int(16 * BLOCK * cpt),
                          seed=seed)
    args = ["--data_source", "local", "--data_files", str(work / "data"), "--tokenizer_name", TOKENIZER,
            "--max_train_tokens", str(tokens), "--report_to", "none", "--write_model_card", "false",
            "--save_final_model", "false"]
    return args, {"files": data, "chars_per_token": round(cpt, 3)}


def _vocab() -> int:
    from hf_optbench.data.tokenizers import load_tokenizer

    return len(load_tokenizer(TOKENIZER))


def headline(work: str, out: str, rehearse: bool, timeout: float, steps: int = 30) -> int:
    """The headline recipe, compiled, ``steps`` steps at the largest micro-batch that fits, nothing else."""
    global BLOCK
    w = Path(work)
    w.mkdir(parents=True, exist_ok=True)
    BLOCK = 64 if rehearse else 1024
    if rehearse:
        micro, size, launch = 2, "tiny", REHEARSAL_LAUNCH
    else:
        import torch

        # at most 32 (32,768 tokens a step, ~0.5 s on an H100): an H200's 64 would double the timed steps' share
        # of the step's time limit, which compiling already fills most of
        micro = largest_micro_batch("gpt2-large", "lion", _vocab(), torch.cuda.get_device_properties(0).total_memory,
                                    limit=32)
        size, launch = "gpt2-large", GPU_LAUNCH
    tokens_per_step = micro * BLOCK
    data_args, data = _data_args(w, tokens_per_step * (steps + 2))
    args = ["-m", "hf_optbench.run", HEADLINE, *data_args, "--max_steps", str(steps),
            "--gradient_accumulation_steps", "1", "--per_device_train_batch_size", str(micro),
            "--save_strategy", "no", "--eval_strategy", "no", "--logging_steps", "10",
            *(REHEARSAL if rehearse else [])]
    result: dict[str, Any] = {"recipe": HEADLINE, "rehearsal": rehearse, "data": data, "tokenizer": TOKENIZER,
                              "micro_batch": micro, "micro_batch_rule": "fixed (rehearsal)" if rehearse else
                              f"planner x {PEAK_OVER_PLAN} within its fit margin",
                              "tokens_per_step": tokens_per_step, "steps": steps,
                              "torch_compile": not rehearse}
    run_dir = w / "run"
    result["run"] = _launch([*launch, *args, "--output_dir", str(run_dir)], w / "run.log", timeout)
    result["run"]["summary"] = _summary(run_dir)
    if result["run"]["summary"] and result["run"]["summary"].get("micro_batch_size"):
        result["memory_vs_planner"] = _plan(size, "lion", result["run"]["summary"])
    _write(out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "data"}, indent=1, default=str)[:6000])
    return 0 if result["run"]["rc"] == 0 else 1


def resume(work: str, out: str, rehearse: bool, timeout: float, steps: int = 20, save: int = 10) -> int:
    """gpt2 eager: ``steps`` steps with a checkpoint at ``save``, then a resume from it; losses compared."""
    global BLOCK
    w = Path(work)
    w.mkdir(parents=True, exist_ok=True)
    BLOCK = 64 if rehearse else 1024
    micro = 2 if rehearse else 8
    launch = REHEARSAL_LAUNCH if rehearse else GPU_LAUNCH
    data_args, data = _data_args(w, micro * BLOCK * (steps + 2), seed=2)
    common = ["-m", "hf_optbench.run", RESUME_RECIPE, *data_args, "--max_steps", str(steps),
              "--gradient_accumulation_steps", "1", "--per_device_train_batch_size", str(micro),
              "--per_device_eval_batch_size", str(micro), "--save_steps", str(save), "--eval_steps", str(steps),
              "--torch_compile", "false", "--metrics_flush_every", "1", *(REHEARSAL if rehearse else [])]
    result: dict[str, Any] = {"recipe": RESUME_RECIPE, "rehearsal": rehearse, "data": data, "steps": steps,
                              "checkpoint_step": save, "torch_compile": False}
    started = time.monotonic()
    first = w / "run"
    result["run"] = _launch([*launch, *common, "--output_dir", str(first)], w / "run.log", timeout)
    result["run"]["summary"] = _summary(first)
    _write(out, result)  # kept if the step's time limit stops the resume
    ckpt = first / f"checkpoint-{save}"
    if result["run"]["rc"] == 0 and ckpt.is_dir():
        second = w / "resumed"
        left = max(30.0, timeout - (time.monotonic() - started))
        result["resume"] = _launch([*launch, *common, "--output_dir", str(second), "--resume_from_checkpoint",
                                    str(ckpt)], w / "resumed.log", left)
        result["resume"]["summary"] = _summary(second)
        result["resume"]["compare"] = _compare(_losses(first), _losses(second), save, steps)
    _write(out, result)
    ok = result["run"]["rc"] == 0 and result.get("resume", {}).get("rc") == 0
    print(json.dumps({k: v for k, v in result.items() if k != "data"}, indent=1, default=str)[:6000])
    return 0 if ok else 1


def _compare(a: dict[int, float], b: dict[int, float], save: int, steps: int) -> dict[str, Any]:
    """The uninterrupted run's losses against the resumed run's, over the steps both logged."""
    shared = sorted(set(a) & set(b))
    diffs = [abs(a[s] - b[s]) for s in shared]
    return {"steps_compared": [shared[0], shared[-1]] if shared else [], "n_steps_compared": len(shared),
            "resumed_steps_logged": sorted(b)[:1] + sorted(b)[-1:],
            "max_abs_loss_diff": max(diffs) if diffs else None,
            "mean_abs_loss_diff": sum(diffs) / len(diffs) if diffs else None,
            "loss_at_checkpoint": a.get(save), "loss_at_end_uninterrupted": a.get(steps),
            "loss_at_end_resumed": b.get(steps)}


def zero(work: str, out: str, rehearse: bool, timeout: float, steps: int = 20) -> int:
    """ZeRO-2 through accelerate's DeepSpeed plugin on one device: DeepSpeed wraps hf_optbench's Lion."""
    try:
        import deepspeed  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        _write(out, {"skipped": f"deepspeed not importable: {type(exc).__name__}: {exc}"})
        print(f"skipped: deepspeed not importable ({exc})")
        return 0
    global BLOCK
    w = Path(work)
    w.mkdir(parents=True, exist_ok=True)
    BLOCK = 64 if rehearse else 1024
    micro = 2 if rehearse else 8
    data_args, data = _data_args(w, micro * BLOCK * (steps + 2), seed=1)
    extra = ["--model_size", "tiny", "--bf16", "false", "--block_size", "64", "--use_cpu", "true"] if rehearse else []
    args = ["--config_file", ZERO_CONFIG, "--num_processes", "1",
            *(["--mixed_precision", "no"] if rehearse else []), "-m", "hf_optbench.run", ZERO_RECIPE, *data_args,
            "--max_steps", str(steps), "--gradient_accumulation_steps", "1", "--per_device_train_batch_size",
            str(micro), "--per_device_eval_batch_size", str(micro), "--save_strategy", "no", "--eval_steps",
            str(steps), "--torch_compile", "false", *extra]
    run_dir = w / "zero2"
    result: dict[str, Any] = {"config": ZERO_CONFIG, "recipe": ZERO_RECIPE, "rehearsal": rehearse, "data": data}
    result["run"] = _launch([*args, "--output_dir", str(run_dir)], w / "zero2.log", timeout)
    s = _summary(run_dir)
    result["run"]["summary"] = s
    if s and s.get("micro_batch_size"):
        result["memory_vs_planner"] = _plan("tiny" if rehearse else "gpt2", "lion", s, zero_stage=2)
    _write(out, result)
    print(json.dumps(result, indent=1, default=str)[:4000])
    return 0 if result["run"]["rc"] == 0 and s and "Lion" in str(s.get("optimizer_impl")) else 1


def tests(out: str, timeout: float) -> int:
    """The ``gpu``-marked tests (4 workers; the MFU benchmark's own test left to the mfu step), outcomes to
    ``out`` by test from pytest's JUnit report."""
    import xml.etree.ElementTree as ET

    junit = Path(out).with_suffix(".xml")
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-n", "4", "-p", "no:cacheprovider", "--timeout", "100",
           "--continue-on-collection-errors", "--deselect",
           "tests/test_benchmarks.py::test_bench_gpu_mfu_on_cuda_reports_mfu", "--junitxml", str(junit), "tests"]
    try:
        rc = subprocess.run(cmd, cwd=ROOT, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError) as exc:
        _write(out, {"error": f"no junit report: {exc}"})
        return rc or 1
    cases = []
    for c in root.iter("testcase"):
        bad = next((k for k in c if k.tag in ("failure", "error", "skipped")), None)
        cases.append({"test": f"{c.get('classname')}::{c.get('name')}", "outcome": "passed" if bad is None else
                      bad.tag, "s": float(c.get("time", 0)), "message": "" if bad is None else
                      bad.get("message", "")[:300]})
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failure", "error", "skipped")}
    _write(out, {"counts": counts, "cases": cases})
    print(counts)
    return rc


# --------------------------------------------------------------------------------------------------- collect
def collect(workdir: str, outdir: str) -> int:
    """WORK/steps.tsv (written by gpu_check.sh) + WORK/<step>.json -> OUTDIR/gpu_check.json, one object per step."""
    d = Path(workdir)
    steps: list[dict[str, Any]] = []
    tsv = d / STEPS_FILE
    for line in (tsv.read_text(encoding="utf-8").splitlines() if tsv.exists() else []):
        name, rc, seconds, limit = line.split("\t")
        status = "ok" if rc == "0" else ("timed out" if rc in ("124", "137") else f"failed (exit {rc})")
        step: dict[str, Any] = {"step": name, "status": status, "exit_code": int(rc), "seconds": float(seconds),
                                "time_limit_s": float(limit)}
        result = d / f"{name}.json"
        if result.exists():
            try:
                step["result"] = json.loads(result.read_text(encoding="utf-8"))
            except ValueError as exc:
                step["result_error"] = f"unreadable {result.name}: {exc}"
        steps.append(step)
    envf = d / "env.json"
    doc = {"env": json.loads(envf.read_text(encoding="utf-8")) if envf.exists() else None, "steps": steps,
           "total_s": round(sum(s["seconds"] for s in steps), 1)}
    _write(Path(outdir) / RESULT_FILE, doc)
    for s in steps:
        print(f"{s['step']:>10}: {s['status']:<18} {s['seconds']:7.1f} s of {s['time_limit_s']:.0f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("env").add_argument("out")
    p = sub.add_parser("tests")
    p.add_argument("out")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole pytest run")
    for name in ("headline", "resume", "zero"):
        p = sub.add_parser(name)
        p.add_argument("work")
        p.add_argument("out")
        p.add_argument("--rehearse", action="store_true", help="the code path on CPU at a toy shape")
        p.add_argument("--timeout", type=float, default=600.0, help="seconds for the step's launches together")
    p = sub.add_parser("collect")
    p.add_argument("workdir")
    p.add_argument("outdir")
    a = ap.parse_args(argv)
    if a.cmd == "env":
        return env(a.out)
    if a.cmd == "tests":
        return tests(a.out, a.timeout)
    if a.cmd == "collect":
        return collect(a.workdir, a.outdir)
    return {"headline": headline, "resume": resume, "zero": zero}[a.cmd](a.work, a.out, a.rehearse, a.timeout)


if __name__ == "__main__":
    sys.exit(main())
