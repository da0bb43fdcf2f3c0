"""Re-run a benchmark script with glibc's malloc thresholds pinned, so allocator state stops moving step times.

Why: torch's CPU tensors come from glibc malloc. Its mmap and trim thresholds adapt to the process's history
(``mallopt(3)``: "dynamic mmap threshold"), so the same 16 MiB logits buffer is served from the heap in one run
and from fresh mmap'd pages in the next, page-faulting on every step. On the tiny shape this moved the median step
of identical code by 5-10 ms (~20%) between runs of one process, which hid sub-millisecond differences. Pinning
both thresholds (``GLIBC_TUNABLES``, read only at process start, hence the re-exec) makes each variant allocate
the same way. Both sides of every comparison run under the same setting; ``--malloc default`` turns it off.
"""

from __future__ import annotations

import os
import platform
import sys

# 32 MiB: glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX, mallopt(3)); trim at 1 GiB so
# freed heap tops are kept for the next step instead of being returned and faulted in again.
PINNED = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"


def malloc_setting() -> str:
    """What this process runs under: "pinned", "default" or "n/a (not glibc)"."""
    if platform.libc_ver()[0] != "glibc":
        return "n/a (not glibc)"
    return "pinned" if PINNED in os.environ.get("GLIBC_TUNABLES", "") else "default"


def reexec_pinned(script: str, argv: list[str]) -> None:
    """Replace this process with ``python script argv`` under pinned thresholds; returns if already pinned or if
    the C library is not glibc (the tunables would be ignored)."""
    if malloc_setting() != "default":
        return
    env = dict(os.environ)
    env["GLIBC_TUNABLES"] = ":".join(filter(None, [env.get("GLIBC_TUNABLES"), PINNED]))
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, script, *argv], env)
