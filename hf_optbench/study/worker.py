"""The warm worker: a process that imports torch, transformers, datasets, accelerate and hf_optbench once, then forks
a fresh child per run of a local sweep, so that a run does not pay ~6 s of interpreter start-up and imports.

    python -m hf_optbench.study.worker      # started by the sweep (launch.py); speaks JSON lines on stdin/stdout
    python -m hf_optbench.study.worker --imports torch   # only these modules warm (tests, other entry points)

Each child is what ``python -m hf_optbench.run ARGS`` would be: its own session (so the sweep's ``kill_tree`` stops
its whole tree), its own stdout/stderr (the run's ``stdout.log``), the run's environment (:data:`RUN_DIR_ENV`
included; in a sweep running several runs at once, its slot's cores, which it pins itself to), the module run as
``__main__`` through :mod:`runpy`, its exit code reported back, and it ends with
``os._exit`` (the worker's exit handlers and buffers are not the run's). Memory and time stay per run: the child is
a new process (its memory dies with it), its peak-RSS counter is reset at start (``/proc/self/clear_refs`` "5";
the recorder resets it again at train begin), and its CPU time comes from ``wait4`` of that child alone.

Why the standard library and not a pool (multiprocessing, concurrent.futures): a pool reuses its processes, so one
run's allocator state, imported optimizer libraries and torch settings would leak into the next run's memory and
time figures; the sweep needs one fresh process per run with a known pid, session and log, which is plain
``os.fork`` plus a handshake. Fork-safety: the worker only imports (the threads alive then are OpenBLAS' and
jemalloc's idle helpers, which re-initialise across fork, the same state a DataLoader forks its workers from); it
never runs a torch op, so torch's OpenMP pool does not exist yet, and it refuses to fork once CUDA is initialised or
a Python thread is running. The sweep does not use it when a GPU is visible (:mod:`hf_optbench.study.worker_client`).

Protocol (one JSON object per line). Worker -> sweep: ``{"event": "ready", ...}`` once; per run
``{"event": "started", "pid": P}`` (the child waits), then ``{"event": "ended", "returncode": RC, "cpu_s": S}``, or
``{"event": "refused", "reason": ...}`` instead of both. Sweep -> worker: the request ``{"target", "argv", "log",
"env", "cwd"}`` (optional: ``"stdout"``, a file for fd 1 apart from the log; ``"environ"``, the child's whole
environment, ``env`` then added to it); after ``started`` and once the sweep has recorded the pid,
``{"go": true}``. End of the sweep's pipe (the sweep ended or was killed) stops the running child's process group
and ends the worker.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from typing import Any

from hf_optbench.run.summary import CPUS_ENV

# transformers loads lazily: these names pull in what a run of hf_optbench.run uses (measured with -X importtime)
_TRANSFORMERS_NAMES = ("Trainer", "TrainingArguments", "TrainerCallback", "GPT2Config", "GPT2LMHeadModel",
                       "PreTrainedTokenizerFast", "HfArgumentParser", "default_data_collator", "set_seed")
# imported by a run later on: deepspeed through transformers/accelerate (~0.3 s), evaluate by the eval accuracy
# metric at the first evaluation (2-10 s); skipped when not installed
_OPTIONAL = ("deepspeed", "safetensors.torch", "evaluate")
# (``__main__`` modules run a command when imported: ``hf_optbench.run.__main__`` would start a run in the worker)
_SKIP_PREFIXES = ("hf_optbench.study", "hf_optbench.cli", "hf_optbench.__main__", "hf_optbench.run.__main__")


# -------------------------------------------------------------------------------------------------- channel
class Channel:
    """JSON lines over a pipe's file descriptor (raw ``os.read``/``os.write``: no buffering to lose across fork)."""

    def __init__(self, read_fd: int | None, write_fd: int | None) -> None:
        self.read_fd, self.write_fd, self._buf, self.eof = read_fd, write_fd, b"", False

    def send(self, msg: dict[str, Any]) -> None:
        data = (json.dumps(msg) + "\n").encode()
        while data:
            data = data[os.write(self.write_fd, data):]

    def pump(self, timeout: float | None) -> bool:
        """Read what is available (waiting up to ``timeout``); False when nothing came."""
        if self.eof:
            return False
        ready, _, _ = select.select([self.read_fd], [], [], timeout)
        if not ready:
            return False
        chunk = os.read(self.read_fd, 65536)
        self._buf += chunk
        self.eof = not chunk
        return True

    def recv(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next message; None when ``timeout`` passed first. Raises EOFError when the other side is gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            if self.eof:
                raise EOFError("the other end of the warm worker's pipe closed")
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self.pump(left) and deadline is not None and time.monotonic() >= deadline:
                return None
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)


# ------------------------------------------------------------------------------------------------- child side
def _redirect(log_path: str, stdout_path: str | None = None) -> None:
    """fd 1 and 2 -> the run's log (append), fd 0 -> /dev/null: the worker's pipes are closed in the child. With
    ``stdout_path``, fd 1 goes there instead (stdout and stderr apart, as a caller of subprocess.run reads them)."""
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    out = os.open(stdout_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if stdout_path else log
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(log, 2)
    for fd in {log, out, null}:
        os.close(fd)
    for stream in (sys.stdout, sys.stderr):  # PYTHONUNBUFFERED semantics, as the plain subprocess path has
        stream.reconfigure(line_buffering=True, write_through=True)


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS ("5" to /proc/self/clear_refs, Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _run_target(kind: str, target: str, argv: list[str]) -> int:
    """Run a module (``python -m``) or script as ``__main__``; the exit code Python would give."""
    import runpy
    import traceback

    sys.argv = [target, *argv]  # runpy puts the module's file in argv[0], as `python -m` does
    try:
        if kind == "module":
            # as in a fresh `python -m`, the module runs as __main__ without a copy of it already imported (the
            # warm one stays with the modules that imported it; runpy would otherwise warn about it)
            sys.modules.pop(target, None)
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python SCRIPT` has it
            runpy.run_path(target, run_name="__main__")
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return int(exc.code or 0)
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:  # what the interpreter does with an uncaught exception: traceback, exit code 1
        traceback.print_exc()
        return 1


def _finish() -> None:
    """The interpreter's exit steps that concern the run: join its non-daemon threads, run the exit handlers the
    run registered (the worker's were dropped at fork), flush logging and stdio. Then the caller os._exit()s."""
    import atexit
    import logging
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def child_main(request: dict[str, Any], go_fd: int, torch_threads: int | None) -> None:
    """The forked child: never returns (os._exit), whatever happens."""
    code = 70
    try:
        import atexit

        atexit._clear()  # the worker's handlers are not this run's
        os.setsid()  # own session and process group: the sweep stops the run's tree, a terminal's Ctrl-C does not
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _redirect(request["log"], request.get("stdout"))
        go = os.read(go_fd, 1)  # the sweep has recorded this pid (or the worker is gone: end here)
        os.close(go_fd)
        if not go:
            print("warm worker: the sweep did not confirm the start; the run did not begin", file=sys.stderr)
            os._exit(75)
        if request.get("environ") is not None:  # the whole environment, in place of the worker's
            os.environ.clear()
            os.environ.update(request["environ"])
        os.environ.update(request.get("env") or {})
        if os.environ.get(CPUS_ENV):  # the sweep slot's cores (the worker inherited them too: this makes it exact)
            os.sched_setaffinity(0, [int(c) for c in os.environ[CPUS_ENV].split(",")])
        os.chdir(request.get("cwd") or os.getcwd())
        reset_peak_rss()  # the recorder resets again at train begin; this covers a peak read before that
        if torch_threads and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(torch_threads)  # the default a fresh process would take
        code = _run_target(request["kind"], request["target"], list(request["argv"]))
        _finish()
    finally:
        os._exit(code)


# ------------------------------------------------------------------------------------------------ worker side
def warm_imports(only: list[str] | None = None) -> list[str]:
    """Import what a run imports (or the modules ``only``); returns the optional modules that were not available."""
    import importlib
    import pkgutil

    import hf_optbench

    missing: list[str] = []
    if only is not None:
        for name in only:
            importlib.import_module(name)
        return missing
    for name in ("torch", "numpy", "datasets", "accelerate", "transformers"):
        importlib.import_module(name)
    transformers = sys.modules["transformers"]
    for attr in _TRANSFORMERS_NAMES:
        getattr(transformers, attr)
    names = [i.name for i in pkgutil.walk_packages(hf_optbench.__path__, "hf_optbench.")
             if not i.name.startswith(_SKIP_PREFIXES)]
    for name in [*names, *_OPTIONAL]:
        try:
            importlib.import_module(name)
        except Exception:  # absent or broken here: a run that needs it imports it itself (and fails as it would)
            missing.append(name)
    return missing


def fork_hazard() -> str | None:
    """Why forking this process now would be unsafe (None: safe)."""
    import threading

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised in the worker"
    if threading.active_count() > 1:
        return f"the worker runs Python threads: {[t.name for t in threading.enumerate()]}"
    return None


def _stop_group(pid: int, grace_s: float = 10.0) -> None:
    """SIGTERM to the child's process group, SIGKILL after ``grace_s``; the child is reaped by the caller."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return
            time.sleep(0.05)


def wait_child(pid: int, chan: Channel) -> tuple[int, float]:
    """Wait for the child (a pidfd wakes us at its exit, else a short poll); if the sweep's pipe closes meanwhile,
    stop the child's group. Returns (exit code as subprocess reports it, the child's user+system CPU seconds)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime
            fds = ([] if chan.eof else [chan.read_fd]) + ([pidfd] if pidfd is not None else [])
            ready, _, _ = select.select(fds, [], [], 5.0 if pidfd is not None else 0.05)
            if chan.read_fd in ready:
                chan.pump(0)
                if chan.eof:  # the sweep is gone: the run must not outlive it
                    _stop_group(pid)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def serve_one(request: dict[str, Any], chan: Channel, torch_threads: int | None) -> None:
    """Fork one child for ``request``, hand its pid to the sweep, start it on "go", report its end."""
    hazard = fork_hazard()
    if hazard:
        chan.send({"event": "refused", "reason": hazard})
        return
    sys.stdout.flush()
    sys.stderr.flush()
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child keeps no end of the worker's pipes: the sweep must see the worker's death as EOF
        os.close(go_write)
        os.close(chan.write_fd)
        child_main(request, go_read, torch_threads)
    os.close(go_read)
    chan.send({"event": "started", "pid": pid})
    try:
        reply = chan.recv()
    except EOFError:
        reply = None
    if reply and reply.get("go"):
        os.write(go_write, b"g")
    os.close(go_write)  # without "go" the child reads end-of-file and exits 75 before the run begins
    code, cpu_s = wait_child(pid, chan)
    if not chan.eof:
        chan.send({"event": "ended", "pid": pid, "returncode": code, "cpu_s": round(cpu_s, 3)})


def serve(read_fd: int = 0, write_fd: int = 1, imports: list[str] | None = None) -> int:
    """The worker's loop: warm imports (all a run needs, or ``imports``), "ready", then one request at a time until
    the sweep's pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the sweep handles Ctrl-C and stops the child itself
    out_fd = os.dup(write_fd)  # replies go here; fd 1 becomes stderr so that stray prints cannot break the protocol
    os.dup2(2, write_fd)
    chan = Channel(read_fd, out_fd)
    t0 = time.perf_counter()
    missing = warm_imports(imports)
    torch = sys.modules.get("torch")
    threads = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")] \
        if os.path.isdir("/proc/self/task") else []
    chan.send({"event": "ready", "pid": os.getpid(), "import_s": round(time.perf_counter() - t0, 3),
               "missing": missing, "native_threads": threads, "clear_refs": reset_peak_rss()})
    torch_threads = torch.get_num_threads() if torch else None  # reads the setting; starts no OpenMP pool
    while True:
        try:
            request = chan.recv()
            if request:
                serve_one(request, chan, torch_threads)
        except (EOFError, BrokenPipeError):  # the sweep closed its ends (finished, interrupted or killed)
            return 0
        if chan.eof:
            return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="hf_optbench's warm worker (started by `hf-optbench sweep`).")
    parser.add_argument("--imports", default=None, help="comma-separated modules to warm instead of a run's set")
    args = parser.parse_args(argv)
    return serve(imports=[m for m in args.imports.split(",") if m] if args.imports is not None else None)


if __name__ == "__main__":
    sys.exit(main())
