"""Real multi-process runs on CPU: `accelerate launch` with two processes (DDP over gloo, and DeepSpeed ZeRO-2),
compared step by step with a one-process run of the same global batch.

Tolerance: two processes average two half-batch gradients where one process takes the mean over the full
batch, so float32 sums are taken in a different order. Measured over these 6 steps: max |delta loss| = 4.8e-7
(DDP). LOSS_ATOL = 1e-4 is asserted; halving the global batch instead (a real mismatch) moves the per-step
loss by 2e-3 to 2.3e-2 here (measured), so the tolerance cannot hide one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures.warm_run import run_python

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "recipes/quickstart_cpu.yaml"
STEPS = 6
GLOBAL_BATCH = 8
LOSS_ATOL = 1e-4
COMMON = ["--optimizer", "lion", "--max_steps", str(STEPS), "--eval_steps", str(STEPS), "--block_size", "64",
          "--per_device_eval_batch_size", "2",
          "--save_strategy", "no", "--seed", "0", "--use_cpu", "true", "--write_model_card", "false",
          "--logging_steps", "3"]  # two loss logs, each reading 3 steps' values from every rank

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _env() -> dict[str, str]:
    # one thread per process: two processes on a 2-core machine, and thread count cannot change the order of
    # reductions between the compared runs
    return dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def _launch(out: Path, processes: int, config: str | None = None) -> dict:
    """One run; returns its summary, metrics rows, wall time and output."""
    per_device = GLOBAL_BATCH // processes
    args = ["-m", "hf_optbench.run", RECIPE, "--output_dir", str(out), "--per_device_train_batch_size",
            str(per_device), *COMMON]
    if config is None:
        cmd = [sys.executable, *args]
    else:
        accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
        cmd = [accelerate, "launch", "--config_file", f"accelerate_configs/{config}", *args]
    started = time.perf_counter()
    if config is None:  # one process: a fork of the warm worker (tests/fixtures/warm_run.py)
        proc = run_python(cmd, cwd=ROOT, env=_env(), timeout=400)
    else:
        proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=400)
    elapsed = time.perf_counter() - started
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((out / "summary.json").read_text())
    return {"summary": summary, "rows": rows, "seconds": elapsed, "out": out, "stderr": proc.stderr}


def _train(rows: list[dict]) -> dict[int, dict]:
    train = [r for r in rows if r["kind"] == "train"]
    steps = [r["step"] for r in train]
    assert steps == list(range(1, STEPS + 1)), f"each step exactly once, got {steps}"
    return {r["step"]: r for r in train}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict:
    return _launch(tmp_path_factory.mktemp("dist") / "one", processes=1)


@pytest.fixture(scope="module")
def ddp_two(tmp_path_factory) -> dict:
    return _launch(tmp_path_factory.mktemp("dist") / "ddp2", processes=2, config="cpu_ddp2.yaml")


def _max_loss_delta(a: dict, b: dict) -> float:
    ta, tb = _train(a["rows"]), _train(b["rows"])
    return max(abs(ta[s]["loss"] - tb[s]["loss"]) for s in ta)


def test_two_process_run_really_has_two_ranks(ddp_two: dict, one_process: dict) -> None:
    s2, s1 = ddp_two["summary"], one_process["summary"]
    assert s2["status"] == "completed"
    assert s2["world_size"] == 2 and s1["world_size"] == 1
    assert s2["micro_batch_size"] * s2["world_size"] == s1["micro_batch_size"] == GLOBAL_BATCH
    assert s2["tokens_per_step"] == s1["tokens_per_step"] == GLOBAL_BATCH * 64
    # rank 0 alone writes: one metrics file, each step once (checked in _train), one summary
    assert len(list(ddp_two["out"].glob("metrics*.jsonl"))) == 1
    print(f"\n1 process: {one_process['seconds']:.1f} s, 2 processes (DDP): {ddp_two['seconds']:.1f} s")


def test_two_process_loss_matches_one_process_same_global_batch(ddp_two: dict, one_process: dict) -> None:
    delta = _max_loss_delta(ddp_two, one_process)
    print(f"\nmax |loss(2 procs) - loss(1 proc)| over {STEPS} steps: {delta:.3g}")
    assert delta <= LOSS_ATOL
    t2, t1 = _train(ddp_two["rows"]), _train(one_process["rows"])
    for step in t1:
        assert t2[step]["lr"] == pytest.approx(t1[step]["lr"], rel=1e-9)
        assert t2[step]["tokens"] == t1[step]["tokens"]


def test_metrics_are_gathered_across_ranks(ddp_two: dict, one_process: dict) -> None:
    s2, s1 = ddp_two["summary"], one_process["summary"]
    # DDP replicates the optimizer: each rank holds the full state, the total is twice one rank's
    assert s2["optimizer_state_bytes"] == s1["optimizer_state_bytes"]
    assert s2["optimizer_state_bytes_total"] == 2 * s2["optimizer_state_bytes"]
    per_rank_peaks = s2.get("peak_memory_bytes_per_rank")
    assert isinstance(per_rank_peaks, list) and len(per_rank_peaks) == 2 and all(p > 0 for p in per_rank_peaks)
    assert s2["peak_memory_bytes"] in per_rank_peaks  # rank 0's own figure, like optimizer_state_bytes
    # each step's loss, read from the device every 3 steps and averaged over the ranks by the recorder, makes up the
    # Trainer's own log: its mean over the 3 steps
    history = json.loads((ddp_two["out"] / "trainer_state.json").read_text())["log_history"]
    logged = {r["step"]: r["loss"] for r in history if "loss" in r}
    rows = _train(ddp_two["rows"])
    assert sorted(logged) == [3, 6]
    for step, loss in logged.items():
        assert loss == pytest.approx(sum(rows[s]["loss"] for s in range(step - 2, step + 1)) / 3, rel=1e-6)


@pytest.fixture(scope="module")
def zero2_two(tmp_path_factory) -> dict:
    pytest.importorskip("deepspeed")
    return _launch(tmp_path_factory.mktemp("dist") / "zero2", processes=2, config="cpu_zero2.yaml")


def test_deepspeed_zero2_keeps_our_optimizer_and_partitions_its_state(zero2_two: dict, one_process: dict) -> None:
    """Lion keeps one fp32 buffer (exp_avg, 4 B/param); AdamW, which DeepSpeed/Trainer would fall back to, keeps
    two. Under ZeRO-2 each of the two ranks holds about half of it."""
    s, s1 = zero2_two["summary"], one_process["summary"]
    assert s["status"] == "completed" and s["world_size"] == 2
    assert "Lion" in s["optimizer_impl"]
    by_name = s["optimizer_state_bytes_by_name"]
    assert "exp_avg" in by_name and "exp_avg_sq" not in by_name, f"optimizer replaced? state names {by_name}"
    total, per_rank = s["optimizer_state_bytes_total"], s["optimizer_state_bytes"]
    assert total == pytest.approx(s1["optimizer_state_bytes"], rel=0.02)  # partitions add up to the whole
    assert per_rank == pytest.approx(total / 2, rel=0.02)
    print(f"\nZeRO-2: state per rank {per_rank} B, total {total} B, one process {s1['optimizer_state_bytes']} B; "
          f"{zero2_two['seconds']:.1f} s")


def test_deepspeed_zero2_follows_our_schedule_and_matches_one_process(zero2_two: dict, one_process: dict) -> None:
    tz, t1 = _train(zero2_two["rows"]), _train(one_process["rows"])
    for step in t1:
        assert tz[step]["lr"] == pytest.approx(t1[step]["lr"], rel=1e-6), f"schedule replaced at step {step}"
    delta = _max_loss_delta(zero2_two, one_process)
    print(f"\nmax |loss(ZeRO-2, 2 procs) - loss(1 proc)|: {delta:.3g}")
    assert delta <= LOSS_ATOL


# --- the GPU configs, launched for real where two or more CUDA devices exist (skipped here by marker) ---------
GPU_COMMON = ["--optimizer", "lion", "--max_steps", "4", "--eval_steps", "4", "--block_size", "64",
              "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2", "--save_strategy", "no",
              "--seed", "0", "--write_model_card", "false", "--use_cpu", "false"]


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.parametrize("config, precision", [("t4x2_ddp.yaml", ["--fp16", "true"]),
                                               ("a100x4_zero3.yaml", ["--bf16", "true"])])
def test_gpu_config_trains_with_our_optimizer(tmp_path: Path, config: str, precision: list[str]) -> None:
    import torch

    n_gpu = min(torch.cuda.device_count(), 4)
    out = tmp_path / config.replace(".yaml", "")
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    cmd = [accelerate, "launch", "--config_file", f"accelerate_configs/{config}", "--num_processes", str(n_gpu),
           "-m", "hf_optbench.run", RECIPE, "--output_dir", str(out), *GPU_COMMON, *precision]
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-5000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == n_gpu
    assert "Lion" in summary["optimizer_impl"]  # DeepSpeed must not swap in its own AdamW
    assert summary["peak_memory_kind"] == "cuda_max_allocated"
    assert summary["optimizer_state_bytes_total"] >= summary["optimizer_state_bytes"] > 0


def _readme_command(config: str) -> list[str]:
    """The launch command of ``config``'s row in accelerate_configs/README.md, as its words."""
    import shlex

    for line in (ROOT / "accelerate_configs" / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] == f"`{config}`":
            return shlex.split(cells[4].strip("`"))
    raise AssertionError(f"accelerate_configs/README.md has no row for {config}")


def test_the_readme_two_process_command_runs_as_written(tmp_path: Path) -> None:
    """The cpu_ddp2 row's command word for word (with the recipe's eval batch it ended in a torch elastic
    traceback: 4 validation blocks < 2 processes x 4), run in a directory that links the repository's recipes and
    configs, so that the recipe's relative output_dir lands there and not in the checkout."""
    cmd = _readme_command("cpu_ddp2.yaml")
    assert cmd[:2] == ["accelerate", "launch"]
    cmd[0] = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    for name in ("accelerate_configs", "recipes"):
        (tmp_path / name).symlink_to(ROOT / name)
    proc = subprocess.run(cmd, cwd=tmp_path, env=dict(_env(), HF_OPTBENCH_CACHE=str(tmp_path / "cache")),
                          capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}"
    (run_dir,) = {p.parent for p in tmp_path.glob("runs/*/summary.json")}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert summary["final_eval_loss"] is not None
    _rerun_as_it_ran(tmp_path, run_dir, summary)


def _rerun_as_it_ran(cwd: Path, run_dir: Path, summary: dict) -> None:
    """Issue 39: config.yaml, the next: line and the card said `hf-optbench run RUN/config.yaml`, which ran the
    2-process run on 1 process (512 tokens per step instead of 1,024, another loss) without a word. Now the rerun
    line is the accelerate launch line that reproduces it, a 1-process rerun stops in one line naming both
    numbers, and the rerun line trains the same plan on 2 processes."""
    rel = run_dir.relative_to(cwd)
    header = (run_dir / "config.yaml").read_text().splitlines()[1].lstrip("# ").strip()
    assert header == (f"accelerate launch --config_file accelerate_configs/cpu_ddp2.yaml -m hf_optbench.run "
                      f"{rel}/config.yaml --output_dir NEW_DIR"), header
    assert summary["launch"]["processes"] == 2 and summary["launch"]["config_file"] == "accelerate_configs/cpu_ddp2.yaml"
    one = run_python([sys.executable, "-m", "hf_optbench.run", f"{rel}/config.yaml", "--output_dir", "runs/one"],
                     cwd=cwd, env=_env(), timeout=120)
    assert one.returncode == 2 and one.stderr.count("\n") == 1, one.stderr
    assert "num_processes 2" in one.stderr and "this run has 1" in one.stderr and header.split(" NEW_DIR")[0] in one.stderr
    cmd = header.replace("NEW_DIR", "runs/rerun").split()
    cmd[0] = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    proc = subprocess.run(cmd, cwd=cwd, env=dict(_env(), HF_OPTBENCH_CACHE=str(cwd / "cache")), capture_output=True,
                          text=True, timeout=500)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}"
    again = json.loads((cwd / "runs" / "rerun" / "summary.json").read_text())
    assert (again["world_size"], again["tokens_per_step"], again["plan_hash"]) == (
        2, summary["tokens_per_step"], summary["plan_hash"])
    assert again["final_train_loss"] == pytest.approx(summary["final_train_loss"], abs=LOSS_ATOL)
