"""A run whose planned memory exceeds what its device has left is refused before the model is built (issue 32:
gpt2-xl, or a position table of 50 million rows, on this CPU allocated 12-26 GB for 13-90 s, then a traceback)."""

from __future__ import annotations

import os
import resource
import subprocess
import time
from pathlib import Path

import pytest

from hf_optbench import machine
from hf_optbench.config.parse import parse_args
from hf_optbench.errors import OptBenchError
from hf_optbench.measure.planner import plan_memory
from hf_optbench.run import memory_fit
from hf_optbench.run.plan import resolve_plan

from fixtures.installed import hf_optbench_command

ROOT = Path(__file__).resolve().parents[2]
QUICK = str(ROOT / "recipes" / "quickstart_cpu.yaml")


def _plan(tmp_path: Path, *extra: str):
    return resolve_plan(parse_args([QUICK, "--output_dir", str(tmp_path / "run"), *extra]))


def _room(monkeypatch, n: int) -> None:
    monkeypatch.setattr(memory_fit, "available_memory", lambda device: machine.Room(n, "it has {} GiB"))


def test_refused_exactly_when_the_plan_exceeds_what_is_left(tmp_path: Path, monkeypatch) -> None:
    plan = _plan(tmp_path, "--model_size", "gpt2")
    need = plan_memory("gpt2", "adamw", precision="fp32", micro_batch_size=8, block_size=128, vocab_size=2000,
                       n_positions=128).total_bytes  # what the quickstart's batch of gpt2 needs
    assert memory_fit.planned_memory(plan, 2000).total_bytes == need
    _room(monkeypatch, need)
    memory_fit.check_memory_fits(plan, 2000)  # fits to the byte
    _room(monkeypatch, need - 1)
    with pytest.raises(OptBenchError, match=rf"the run needs {need / 2**30:.1f} GiB \(gpt2, .* it cannot fit"):
        memory_fit.check_memory_fits(plan, 2000)
    lower = memory_fit.planned_memory(plan, 1).total_bytes  # the tokenizer not loaded yet: one row for its vocabulary
    assert lower < need
    memory_fit.check_memory_fits(plan, None)  # a lower bound below what is left: not refused
    _room(monkeypatch, lower - 1)
    with pytest.raises(OptBenchError, match="the run needs at least"):
        memory_fit.check_memory_fits(plan, None)


def test_the_escape_hatch_and_what_the_planner_cannot_plan_are_not_refused(tmp_path: Path, monkeypatch) -> None:
    _room(monkeypatch, 1)
    memory_fit.check_memory_fits(_plan(tmp_path, "--skip_memory_check", "true"), 2000)
    init = tmp_path / "init"
    init.mkdir()
    (init / "config.json").write_text("{}")
    (init / "model.safetensors").write_bytes(b"")
    memory_fit.check_memory_fits(_plan(tmp_path, "--init_from", str(init)), 2000)  # the checkpoint's shape


def test_a_dotted_path_optimizer_counts_no_state(tmp_path: Path) -> None:
    """No state formula: its figure is a lower bound (parameters, gradients, activations), never a wrong refusal."""
    plan = _plan(tmp_path, "--optimizer", "torch.optim.SGD", "--learning_rate", "0.1")
    dotted = memory_fit.planned_memory(plan, 2000)
    adamw = memory_fit.planned_memory(_plan(tmp_path), 2000)
    assert dotted.optimizer_state_bytes == 0
    assert dotted.total_bytes == adamw.total_bytes - adamw.optimizer_state_bytes


def test_a_cgroup_limit_lowers_what_is_available(tmp_path: Path, monkeypatch) -> None:
    limit, usage, stat = (tmp_path / n for n in ("memory.max", "memory.current", "memory.stat"))
    monkeypatch.setattr(machine, "CGROUPS", ((limit, usage, stat, "inactive_file"),))
    limit.write_text("max\n")
    assert machine._cgroup_room() is None
    limit.write_text(f"{8 * 2**30}\n")
    usage.write_text(f"{6 * 2**30}\n")
    stat.write_text(f"anon 1\ninactive_file {2**30}\n")
    assert machine._cgroup_room() == 3 * 2**30  # limit - usage + the cache the kernel reclaims first
    room = memory_fit.available_memory(type("Device", (), {"type": "cpu"})())
    assert room.bytes <= 3 * 2**30
    assert memory_fit.available_memory(type("Device", (), {"type": "mps"})()) is None


def _as_limit(n: int):
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (n, n))
    return limit


@pytest.mark.slow
def test_through_the_installed_command_under_an_address_space_limit(tmp_path: Path) -> None:
    """gpt2-large under `ulimit -v` 7.5 GiB: refused in one line naming the planned and the available GiB, before
    any data or model work. Without the check it allocated until torch's "can't allocate memory" traceback (27.6 s
    measured here with --skip_memory_check true)."""
    exe = hf_optbench_command()
    out, cache = tmp_path / "run", tmp_path / "cache"
    t0 = time.monotonic()
    proc = subprocess.run([str(exe), "run", QUICK, "--output_dir", str(out), "--model_size", "gpt2-large"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, preexec_fn=_as_limit(int(7.5 * 2**30)),
                          env=dict(os.environ, HF_OPTBENCH_CACHE=str(cache), HF_HUB_OFFLINE="1"))
    elapsed = time.monotonic() - t0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "the run needs at least 13.4 GiB (gpt2-large" in lines[0], lines[0]
    assert "and the address-space limit (ulimit -v) leaves" in lines[0] and "--skip_memory_check true" in lines[0]
    assert not out.exists() and not cache.exists(), "data or output written before the refusal"
    print(f"\nrefused in {elapsed:.1f} s")
