"""What this machine has, known without importing torch, and the one start-up notice that is noise where it has none.

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

DEEPSPEED_LOGGER = "DeepSpeed"  # deepspeed/utils/logging.py: LoggerFactory.create_logger(name="DeepSpeed")
# deepspeed/accelerator/real_accelerator.py, get_accelerator(): logged when its auto-detection found no accelerator
CPU_FALLBACK_NOTICE = "Setting accelerator to CPU."


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
