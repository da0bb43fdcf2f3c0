"""The Python half of ``benchmarks/gpu_check.sh``: the steps that are more than one command, and the collector.

    python benchmarks/gpu_check.py env OUT.json               # versions, device
    python benchmarks/gpu_check.py headline WORK OUT.json     # the headline recipe, ~100 steps, then a resume
    python benchmarks/gpu_check.py zero WORK OUT.json         # ZeRO-2 on one GPU with hf_optbench's Lion
    python benchmarks/gpu_check.py collect WORK OUTDIR        # WORK's steps.tsv + step JSONs -> OUTDIR/gpu_check.json

``--rehearse`` (headline, zero) runs the same code path on the CPU at a toy shape (``tiny``, fp32, no compile,
10 steps): a check of the script before a GPU is lent, never a measurement.

The headline step runs ``accelerate launch -m hf_optbench.run recipes/lion_gpt2_large.yaml`` on one GPU as the
recipe says (gpt2-large, Lion, bf16, ``torch.compile``, block 1024, micro-batch 4), with three changes that the
machine forces: the data is generated here in the c4 layout that ``allenai/c4`` config ``th`` has on the Hub
(documents recombined from the bundled Thai sample's sentences, read through the same json builder as the Hub's
files), the tokenizer is the bundled ``builtin:thai-bpe-2k`` (the Hub's ``flax-community/gpt2-base-thai`` cannot
be fetched there: 2,048 rows instead of 50,304 in the embedding), and ``gradient_accumulation_steps`` is 2, not
32 (the 100 steps fit the time limit; tokens per step 8,192). It runs 100 steps with a checkpoint at 50, then a
second run resumes from that checkpoint into another directory; their losses over steps 51-100 are compared.
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


def _shape(rehearse: bool) -> dict[str, Any]:
    global BLOCK
    if rehearse:  # the code path on a CPU: never a measurement
        BLOCK = 64
        return {"size": "tiny", "steps": 10, "save": 5, "accum": 1, "micro": 2,
                "extra": ["--model_size", "tiny", "--bf16", "false", "--torch_compile", "false", "--use_cpu", "true",
                          "--block_size", "64", "--per_device_train_batch_size", "2",
                          "--per_device_eval_batch_size", "2", "--dataloader_num_workers", "0"],
                "launch": ["--cpu", "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no",
                           "--dynamo_backend", "no"]}
    BLOCK = 1024
    return {"size": "gpt2-large", "steps": 100, "save": 50, "accum": 2, "micro": 4, "extra": [],
            "launch": ["--num_processes", "1", "--num_machines", "1", "--mixed_precision", "bf16",
                       "--dynamo_backend", "no"]}


def headline(work: str, out: str, rehearse: bool, timeout: float, compile_: bool = True) -> int:
    """The headline recipe on one device, 100 steps with a checkpoint at 50, then a resume from checkpoint-50."""
    shape = _shape(rehearse)
    w = Path(work)
    w.mkdir(parents=True, exist_ok=True)
    tokens_per_step = shape["micro"] * shape["accum"] * BLOCK
    train_tokens = tokens_per_step * (shape["steps"] + 2)
    cpt = _chars_per_token()
    data = make_c4_layout(w / "data", train_chars=int(train_tokens * cpt * 1.3), valid_chars=int(16 * BLOCK * cpt))
    common = ["-m", "hf_optbench.run", HEADLINE, "--data_source", "local", "--data_files", str(w / "data"),
              "--tokenizer_name", TOKENIZER, "--max_steps", str(shape["steps"]), "--gradient_accumulation_steps",
              str(shape["accum"]), "--save_steps", str(shape["save"]), "--eval_steps", str(shape["save"]),
              "--max_train_tokens", str(train_tokens), "--report_to", "none", "--write_model_card", "false",
              "--save_final_model", "false", "--metrics_flush_every", "1", "--logging_steps", "1",
              *shape["extra"], *([] if compile_ else ["--torch_compile", "false"])]
    result: dict[str, Any] = {"recipe": HEADLINE, "rehearsal": rehearse, "data": data,
                              "tokenizer": TOKENIZER, "chars_per_token": round(cpt, 3),
                              "tokens_per_step": tokens_per_step, "steps": shape["steps"],
                              "checkpoint_step": shape["save"], "torch_compile": compile_ and not rehearse}
    started = time.monotonic()
    first = w / "run"
    result["run"] = _launch([*shape["launch"], *common, "--output_dir", str(first)], w / "run.log", timeout)
    result["run"]["summary"] = _summary(first)
    if result["run"]["summary"] and result["run"]["summary"].get("micro_batch_size"):
        result["memory_vs_planner"] = _plan(shape["size"], "lion", result["run"]["summary"])
    _write(out, result)  # kept if the step's time limit stops the resume
    ckpt = first / f"checkpoint-{shape['save']}"
    if result["run"]["rc"] == 0 and ckpt.is_dir():
        second = w / "resumed"
        left = max(30.0, timeout - (time.monotonic() - started))
        result["resume"] = _launch([*shape["launch"], *common, "--output_dir", str(second),
                                    "--resume_from_checkpoint", str(ckpt)], w / "resumed.log", left)
        result["resume"]["summary"] = _summary(second)
        a, b = _losses(first), _losses(second)
        shared = sorted(set(a) & set(b))
        diffs = [abs(a[s] - b[s]) for s in shared]
        result["resume"]["compare"] = {
            "steps_compared": [shared[0], shared[-1]] if shared else [],
            "n_steps_compared": len(shared), "resumed_steps_logged": sorted(b)[:1] + sorted(b)[-1:],
            "max_abs_loss_diff": max(diffs) if diffs else None,
            "mean_abs_loss_diff": sum(diffs) / len(diffs) if diffs else None,
            "loss_at_checkpoint": a.get(shape["save"]), "loss_at_end_uninterrupted": a.get(shape["steps"]),
            "loss_at_end_resumed": b.get(shape["steps"]),
        }
    _write(out, result)
    ok = result["run"]["rc"] == 0 and result.get("resume", {}).get("rc") == 0
    print(json.dumps({k: v for k, v in result.items() if k != "data"}, indent=1, default=str)[:6000])
    return 0 if ok else 1


def zero(work: str, out: str, rehearse: bool, timeout: float) -> int:
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
    steps, micro = 20, 8 if not rehearse else 2
    cpt = _chars_per_token()
    data = make_c4_layout(w / "data", train_chars=int(micro * BLOCK * (steps + 2) * cpt * 1.3),
                          valid_chars=int(16 * BLOCK * cpt), seed=1)
    extra = (["--model_size", "tiny", "--bf16", "false", "--block_size", "64", "--use_cpu", "true"]
             if rehearse else [])
    args = ["--config_file", ZERO_CONFIG, "--num_processes", "1",
            *(["--mixed_precision", "no"] if rehearse else []), "-m", "hf_optbench.run", ZERO_RECIPE,
            "--data_source", "local", "--data_files", str(w / "data"), "--tokenizer_name", TOKENIZER,
            "--max_steps", str(steps), "--gradient_accumulation_steps", "1", "--per_device_train_batch_size",
            str(micro), "--per_device_eval_batch_size", str(micro), "--save_strategy", "no", "--eval_steps",
            str(steps), "--torch_compile", "false", "--report_to", "none", "--write_model_card", "false",
            "--save_final_model", "false", "--max_train_tokens", str(micro * BLOCK * (steps + 2)), *extra]
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
    for name in ("headline", "zero"):
        p = sub.add_parser(name)
        p.add_argument("work")
        p.add_argument("out")
        p.add_argument("--rehearse", action="store_true", help="the code path on CPU at a toy shape")
        p.add_argument("--timeout", type=float, default=600.0, help="seconds for the step's launches together")
        p.add_argument("--no-compile", action="store_true", help="headline: both runs without torch.compile")
    p = sub.add_parser("collect")
    p.add_argument("workdir")
    p.add_argument("outdir")
    a = ap.parse_args(argv)
    if a.cmd == "env":
        return env(a.out)
    if a.cmd == "collect":
        return collect(a.workdir, a.outdir)
    if a.cmd == "headline":
        return headline(a.work, a.out, a.rehearse, a.timeout, compile_=not a.no_compile)
    return zero(a.work, a.out, a.rehearse, a.timeout)


if __name__ == "__main__":
    sys.exit(main())
