"""Where a run's numbers came from: the code (git commit, uncommitted changes) and the environment (package
versions, device, allocator settings). Recorded in summary.json so a figure can be reproduced or discounted."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

# Packages whose versions change the figures; None in the record means "not installed".
RECORDED_PACKAGES = ("hf_optbench", "torch", "transformers", "accelerate", "datasets", "tokenizers", "evaluate",
                     "bitsandbytes", "lion-pytorch", "schedulefree", "pytorch-optimizer", "deepspeed", "wandb")


def git_state(path: Path | None = None) -> dict[str, Any]:
    """Commit of the code that ran and whether its tree had uncommitted changes (None outside git)."""
    where = path or Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True,
                                timeout=10)
        if commit.returncode != 0:
            return {"commit": None, "dirty": None}
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                                capture_output=True, text=True, timeout=10)
        return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def environment() -> dict[str, Any]:
    """Versions and devices a reader needs to reproduce the figures."""
    from importlib import metadata

    import torch

    versions = {}
    for pkg in RECORDED_PACKAGES:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": versions,
        "torch_cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({platform.processor() or platform.machine()})",
        "device_count": torch.cuda.device_count() if cuda else 1,
        "cpu_threads": torch.get_num_threads(),
        # glibc malloc settings move CPU step times by ~25% (README, benchmark 1), so a run records them
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
    }
