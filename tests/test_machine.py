"""Quiet runs (issue 33 item 4): a CPU run's console holds no warning line. DeepSpeed's accelerator fall-back notice
is dropped at its logger where no GPU is visible (hf_optbench.machine), and DDP's find_unused_parameters warning is
gone with hf_optbench's default ``ddp_find_unused_parameters: false`` (config.parse.TRAINING_DEFAULTS)."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hf_optbench.machine import (
    CPU_FALLBACK_NOTICE,
    DEEPSPEED_LOGGER,
    _DropCpuFallbackNotice,
    gpu_visible,
    quiet_deepspeed_cpu_notice,
    slurm_job_id,
)

ROOT = Path(__file__).resolve().parents[1]
NOISE = re.compile(r"warn|deprecat", re.IGNORECASE)


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord(DEEPSPEED_LOGGER, logging.WARNING, __file__, 1, message, None, None)


def test_the_filter_drops_that_notice_and_nothing_else() -> None:
    keep = _DropCpuFallbackNotice()
    assert not keep.filter(_record(CPU_FALLBACK_NOTICE + " If you have GPU or other accelerator, we were unable to "
                                                          "detect it."))
    assert keep.filter(_record("Setting ds_accelerator to cuda (auto detect)"))
    assert keep.filter(_record("some other DeepSpeed warning"))


def test_installed_once_and_only_without_a_visible_gpu() -> None:
    logger = logging.getLogger(DEEPSPEED_LOGGER)
    assert quiet_deepspeed_cpu_notice({"CUDA_VISIBLE_DEVICES": ""}) is (not os.path.exists("/dev/kfd"))
    quiet_deepspeed_cpu_notice({"CUDA_VISIBLE_DEVICES": ""})
    assert sum(isinstance(f, _DropCpuFallbackNotice) for f in logger.filters) <= 1
    if gpu_visible({}):
        assert quiet_deepspeed_cpu_notice({}) is False


@pytest.mark.skipif(gpu_visible(), reason="on a GPU machine DeepSpeed finds the GPU and says nothing")
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="the notice comes from DeepSpeed")
def test_a_quickstart_run_prints_no_warning_line(tmp_path: Path) -> None:
    """The quickstart as a user runs it (the installed command, a fresh process), shortened to 4 steps with an
    evaluation and a checkpoint; every console line (stdout and stderr) is read. Before: DeepSpeed's
    `[WARNING] [real_accelerator.py:...] Setting accelerator to CPU...` on every CPU run."""
    exe = Path(sys.executable).with_name("hf-optbench")
    proc = subprocess.run(
        [str(exe), "run", str(ROOT / "recipes" / "quickstart_cpu.yaml"), "--max_steps", "4", "--eval_steps", "2",
         "--save_steps", "2", "--output_dir", str(tmp_path / "run")],
        cwd=tmp_path, env={**os.environ, "HF_OPTBENCH_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    noisy = [line for line in proc.stdout.splitlines() if NOISE.search(line)]
    assert not noisy, "\n".join(noisy)
    assert "eval_loss" in proc.stdout and "wrote " in proc.stdout


def test_ddp_is_told_that_gpt2_uses_every_parameter() -> None:
    """transformers' default (None: True for a model without gradient checkpointing) makes torch's reducer warn
    on every two-process run; the accelerate README's cpu_ddp2 command is run with its console checked in
    tests/test_readme_commands.py."""
    from hf_optbench.config.parse import TRAINING_DEFAULTS, parse_args

    assert TRAINING_DEFAULTS["ddp_find_unused_parameters"] is False
    cfg = parse_args([str(ROOT / "recipes" / "quickstart_cpu.yaml"), "--output_dir", "/tmp/unused-by-this-test"])
    assert cfg.training.ddp_find_unused_parameters is False


def test_the_slurm_job_id_is_spelled_as_submitit_and_sbatch_name_it() -> None:
    """A task of a job array is ARRAYID_TASK (what the sweep's state file records), not its own SLURM_JOB_ID."""
    assert slurm_job_id({"SLURM_JOB_ID": "12", "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "3"}) == "7_3"
    assert slurm_job_id({"SLURM_JOB_ID": "12"}) == "12"
    assert slurm_job_id({}) is None
