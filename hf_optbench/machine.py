"""What this machine has, known without importing torch (a GPU visible, the memory a process can still allocate), and
the one start-up notice that is noise where it has none.

Why a logging filter for DeepSpeed: with DeepSpeed installed, every Trainer imports it (accelerate's
``extract_model_from_parallel`` does ``from deepspeed import DeepSpeedEngine`` in ``Trainer.__init__`` whenever
the package is importable), and DeepSpeed's accelerator auto-detection then logs ``[WARNING] ... Setting
accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.`` on every CPU run. Nothing in
hf_optbench imports DeepSpeed on a plain run, so "import it only where it is used" cannot remove it; and
``DS_ACCELERATOR=cpu`` (DeepSpeed's override) would change what DeepSpeed picks on a machine with an accelerator this
check cannot see (an NPU, an XPU). The filter drops that one message, and only where no GPU device is visible:
where it is, the message would be news and stays.
"""

from __future__ import annotations

import glob
import logging
import os
import resource
from dataclasses import dataclass
from pathlib import Path

DEEPSPEED_LOGGER = "DeepSpeed"  # deepspeed/utils/logging.py: LoggerFactory.create_logger(name="DeepSpeed")
# deepspeed/accelerator/real_accelerator.py, get_accelerator(): logged when its auto-detection found no accelerator
CPU_FALLBACK_NOTICE = "Setting accelerator to CPU."


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (what a timing was measured on), else what ``platform`` says."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_visible(env: dict[str, str] | None = None) -> bool:
    """Whether a process could see a GPU, from device files and CUDA_VISIBLE_DEVICES alone (no CUDA initialisation)."""
    env = dict(os.environ) if env is None else env
    hidden = env.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1")
    return (not hidden and bool(glob.glob("/dev/nvidia[0-9]*"))) or os.path.exists("/dev/kfd")


class _DropCpuFallbackNotice(logging.Filter):
    """Drops DeepSpeed's CPU fall-back notice, and nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(CPU_FALLBACK_NOTICE)


def quiet_deepspeed_cpu_notice(env: dict[str, str] | None = None) -> bool:
    """Install the filter on DeepSpeed's logger (created here if DeepSpeed is not imported yet: it keeps the
    filter when it configures the logger) when no GPU is visible; True when it is installed. Idempotent."""
    if gpu_visible(env):
        return False
    logger = logging.getLogger(DEEPSPEED_LOGGER)
    if not any(isinstance(f, _DropCpuFallbackNotice) for f in logger.filters):
        logger.addFilter(_DropCpuFallbackNotice())
    return True


# ------------------------------------------------------------------------------------------------- memory room
# cgroup v2 and v1 files at the mount a container sees as its own (limit, usage, the usage the kernel reclaims
# first: page cache not recently used, as psutil's "available" counts it).
CGROUPS = ((Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current"),
            Path("/sys/fs/cgroup/memory.stat"), "inactive_file"),
           (Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"), Path("/sys/fs/cgroup/memory/memory.usage_in_bytes"),
            Path("/sys/fs/cgroup/memory/memory.stat"), "total_inactive_file"))
UNLIMITED = 2**60  # a cgroup v1 "no limit" reads 9223372036854771712


@dataclass(frozen=True)
class Room:
    """Bytes the run can still allocate on its device, and where the figure comes from: a phrase for the error line
    with ``{}`` where the GiB go."""

    bytes: int
    source: str


def _cgroup_room() -> int | None:
    """What the container's memory limit leaves (limit - usage + reclaimable cache), or None without a limit."""
    for limit_file, usage_file, stat_file, inactive_key in CGROUPS:
        try:
            text = limit_file.read_text().strip()
            if text == "max" or int(text) >= UNLIMITED:
                return None
            usage = int(usage_file.read_text().strip())
            stat = dict(line.split() for line in stat_file.read_text().splitlines() if len(line.split()) == 2)
        except (OSError, ValueError):
            continue
        return max(int(text) - usage + int(stat.get(inactive_key, 0)), 0)
    return None


def _address_space_room() -> int | None:
    """What ``ulimit -v`` (RLIMIT_AS) leaves of this process's address space, or None without a limit."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    import psutil

    return max(limit - psutil.Process().memory_info().vms, 0)


def cpu_memory_room() -> Room:
    """What this process can still allocate in the machine's RAM: the least of psutil's available RAM, a cgroup
    limit's room and an address-space limit's room (both kill or fail a process that psutil's figure would let
    through). Read by the model's memory check (run.memory_fit) and the bounds on sizes (config.bounds)."""
    import psutil

    rooms = [Room(int(psutil.virtual_memory().available), "this machine has {} GiB available")]
    for limited, source in ((_cgroup_room(), "the container's memory limit (cgroup) leaves {} GiB"),
                            (_address_space_room(), "the address-space limit (ulimit -v) leaves {} GiB")):
        if limited is not None:
            rooms.append(Room(limited, source))
    return min(rooms, key=lambda r: r.bytes)


def slurm_job_id(env: dict[str, str] | None = None) -> str | None:
    """The SLURM job this process runs in, spelled as sbatch and submitit name it (``ARRAYID_TASK`` for a task of a
    job array, else ``SLURM_JOB_ID``), or None outside SLURM. Why: a sweep's state file records the id it
    submitted; a run that records the id it ran under shows that it ran as that job, not merely that one was
    submitted."""
    env = dict(os.environ) if env is None else env
    array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return env.get("SLURM_JOB_ID") or None
