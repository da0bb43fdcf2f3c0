"""Sweeps: a base recipe x a matrix of optimizers, model sizes, seeds (and learning-rate multipliers), one
process per run, restartable.

    hf-optbench sweep recipes/sweeps/cpu_demo.yaml [--dry-run] [--max-runs N] [--retry-failed] [--output-dir DIR]

Sweep file (YAML)::

    base: recipes/quickstart_cpu.yaml      # a run recipe; relative paths: current dir first, then the sweep file's
    output_dir: runs/cpu_demo              # relative to the current directory
    overrides: {max_steps: 60}             # recipe keys applied to every run
    matrix:
      optimizer: [adamw, lion]
      model_size: [tiny, mini]
      seed: [0, 1]
      lr_multipliers: [0.5, 1, 2]          # optional: x the run's resolved learning rate (tuning grids)
    per_optimizer: {lion: {weight_decay: 1.0}}   # optional recipe keys for one optimizer
    per_model_size: {gpt2-xl: {per_device_train_batch_size: 4}}   # optional recipe keys for one size
    launcher:
      type: accelerate                     # accelerate (default) | python | command
      accelerate_config: accelerate_configs/cpu.yaml
      command: [...]                       # type command: argv prefix that accepts hf_optbench.run's arguments
      executor: local                      # local (default) | slurm (submitit; one job per run)
      slurm: {partition: gpu, gpus_per_node: 4, timeout_min: 120}   # submitit parameters
      timeout_s: null                      # per-run wall-clock limit (local executor)
      env: {}                              # extra environment variables for every run
      validate: true                       # parse every run's arguments in-process before launching

Why one process per run: allocator caches and leftovers of a previous optimizer would skew the next run's memory
figures (DESIGN.md). Why the state file: a sweep is killed (pre-emption, Ctrl-C, OOM killer) and must restart
without redoing or duplicating finished runs. The run's own ``summary.json`` decides whether it finished
(completed/diverged; failed/oom are final too unless ``--retry-failed``); ``sweep_state.jsonl`` records every
attempt, one JSON line per event written with a single O_APPEND write. An unfinished run directory is resumed
from its last ``checkpoint-*`` (``--resume_from_checkpoint true``) or moved aside to ``<run_id>.incomplete-<n>``;
nothing is ever deleted.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import OptBenchError

SWEEP_KEYS = {"base", "output_dir", "overrides", "matrix", "per_optimizer", "per_model_size", "launcher", "name",
              "description"}
MATRIX_KEYS = {"optimizer", "model_size", "seed", "lr_multipliers"}
LAUNCHER_KEYS = {"type", "accelerate_config", "command", "executor", "slurm", "timeout_s", "env", "validate",
                 "progress_interval_s"}
LAUNCHER_TYPES = ("accelerate", "python", "command")
EXECUTORS = ("local", "slurm")
# Keys the sweep sets per run: in overrides they would be silently replaced.
RESERVED_KEYS = {"optimizer", "model_size", "seed", "output_dir"}
FINAL_STATUSES = ("completed", "diverged", "failed", "oom")
SUCCESS_STATUSES = ("completed", "diverged")
OOM_PATTERN = re.compile(r"out of memory|OutOfMemoryError|can't allocate memory|Cannot allocate memory", re.I)
STATE_FILE = "sweep_state.jsonl"
MANIFEST_FILE = "sweep_manifest.json"
RUN_DIR_ENV = "HF_OPTBENCH_SWEEP_RUN_DIR"  # marks a run's processes, so a restart finds its orphans
SUBMITIT_GENERIC = {"name", "timeout_min", "mem_gb", "nodes", "cpus_per_task", "gpus_per_node", "tasks_per_node",
                    "stderr_to_stdout"}


# ----------------------------------------------------------------------------------------------------- spec
@dataclass
class RunSpec:
    """One point of the matrix and the arguments of its run (without --output_dir)."""

    run_id: str
    optimizer: str
    model_size: str
    seed: int
    lr_multiplier: float | None
    args: list[str]
    learning_rate: float | None = None
    max_steps: int | None = None


@dataclass
class SweepSpec:
    path: Path
    base: Path
    output_dir: Path
    overrides: dict[str, Any]
    per_optimizer: dict[str, dict[str, Any]]
    per_model_size: dict[str, dict[str, Any]]
    launcher: dict[str, Any]
    runs: list[RunSpec] = field(default_factory=list)
    name: str = ""

    @property
    def runs_dir(self) -> Path:
        return self.output_dir / "runs"

    def run_dir(self, run: RunSpec) -> Path:
        return self.runs_dir / run.run_id


def _fmt_mult(m: float) -> str:
    return f"{m:g}"


def run_id_for(optimizer: str, model_size: str, seed: int, lr_multiplier: float | None = None) -> str:
    """Deterministic, filesystem-safe id of a matrix point: ``adamw__tiny__s0`` or ``lion__mini__s1__lrx0.5``."""
    rid = f"{optimizer}__{model_size}__s{seed}"
    if lr_multiplier is not None:
        rid += f"__lrx{_fmt_mult(lr_multiplier)}"
    return re.sub(r"[^A-Za-z0-9_.\-]", "-", rid)


def _resolve_path(value: str, sweep_file: Path, key: str) -> Path:
    p = Path(value).expanduser()
    for cand in ([p] if p.is_absolute() else [Path.cwd() / p, sweep_file.parent / p]):
        if cand.is_file():
            return cand.resolve()
    raise OptBenchError(
        f"{key} '{value}' of sweep '{sweep_file}' not found (looked in the current directory and next to the "
        "sweep file). Fix the path."
    )


def _as_list(matrix: dict[str, Any], key: str, required: bool) -> list[Any]:
    value = matrix.get(key)
    if value is None:
        if required:
            raise OptBenchError(f"sweep matrix needs '{key}': a list, e.g. {key}: [...].")
        return []
    if not isinstance(value, list):
        value = [value]
    if required and not value:
        raise OptBenchError(f"sweep matrix '{key}' is empty: give at least one value.")
    if len(set(map(str, value))) != len(value):
        raise OptBenchError(f"sweep matrix '{key}' lists a value twice: {value}. Remove the duplicate.")
    return value


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise OptBenchError(f"{where} must be a mapping (key: value), got {type(value).__name__}.")
    return value


def _check_keys(mapping: Any, allowed: set[str], where: str) -> dict[str, Any]:
    mapping = _mapping(mapping, where)
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], sorted(allowed), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise OptBenchError(f"unknown key '{unknown[0]}' in {where}.{hint} Allowed: {', '.join(sorted(allowed))}.")
    return mapping


def load_sweep(path: str | os.PathLike[str], output_dir: str | None = None) -> SweepSpec:
    """Read and check a sweep file (structure only; :func:`validate_runs` checks every run's arguments)."""
    import yaml

    from .config import to_tokens

    sweep_file = Path(path)
    if not sweep_file.is_file():
        raise OptBenchError(f"sweep file not found: '{path}'. Pass an existing YAML file (see recipes/sweeps/).")
    try:
        raw = yaml.safe_load(sweep_file.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise OptBenchError(f"sweep '{path}' is not valid YAML: {exc}") from exc
    raw = _check_keys(raw, SWEEP_KEYS, f"sweep '{path}'")
    if "base" not in raw:
        raise OptBenchError(f"sweep '{path}' needs 'base: <recipe.yaml>' (the recipe every run starts from).")
    base = _resolve_path(str(raw["base"]), sweep_file, "base")
    overrides = dict(_mapping(raw.get("overrides"), "overrides"))
    bad = sorted(RESERVED_KEYS & set(overrides))
    if bad:
        raise OptBenchError(f"'{bad[0]}' cannot be an override: the sweep sets it per run. Put it in 'matrix' "
                            "(optimizer, model_size, seed) or use --output-dir / 'output_dir' for the sweep.")
    matrix = _check_keys(raw.get("matrix"), MATRIX_KEYS, "matrix")
    optimizers = [str(o) for o in _as_list(matrix, "optimizer", True)]
    sizes = [str(s) for s in _as_list(matrix, "model_size", True)]
    seeds = _as_list(matrix, "seed", False) or [0]
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise OptBenchError(f"matrix seed must be a list of integers, got {seeds}.")
    mults = _as_list(matrix, "lr_multipliers", False)
    for m in mults:
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not m > 0:
            raise OptBenchError(f"lr_multipliers must be positive numbers, got {m!r}. E.g. [0.25, 0.5, 1, 2, 4].")
    per_opt = _check_keys(raw.get("per_optimizer"), set(optimizers), "per_optimizer (keys must be matrix optimizers)")
    per_size = _check_keys(raw.get("per_model_size"), set(sizes), "per_model_size (keys must be matrix model sizes)")
    for where, table in (("per_optimizer", per_opt), ("per_model_size", per_size)):
        for name, extra in table.items():
            _check_keys(extra, set(_mapping(extra, f"{where}.{name}")) - RESERVED_KEYS, f"{where}.{name}")
    launcher = dict(_check_keys(raw.get("launcher"), LAUNCHER_KEYS, "launcher"))
    launcher.setdefault("type", "accelerate")
    launcher.setdefault("executor", "local")
    launcher.setdefault("validate", True)
    if launcher["type"] not in LAUNCHER_TYPES:
        raise OptBenchError(f"launcher.type '{launcher['type']}' is not one of {', '.join(LAUNCHER_TYPES)}.")
    if launcher["executor"] not in EXECUTORS:
        raise OptBenchError(f"launcher.executor '{launcher['executor']}' is not one of {', '.join(EXECUTORS)}.")
    if launcher["type"] == "accelerate":
        if not launcher.get("accelerate_config"):
            raise OptBenchError("launcher.type accelerate needs launcher.accelerate_config (e.g. "
                                "accelerate_configs/cpu.yaml), or use type: python.")
        launcher["accelerate_config"] = str(_resolve_path(str(launcher["accelerate_config"]), sweep_file,
                                                          "launcher.accelerate_config"))
    if launcher["type"] == "command" and not (isinstance(launcher.get("command"), list) and launcher["command"]):
        raise OptBenchError("launcher.type command needs launcher.command: a list, e.g. [python, wrapper.py].")
    out = Path(output_dir or raw.get("output_dir") or Path("runs") / sweep_file.stem)
    spec = SweepSpec(path=sweep_file.resolve(), base=base, output_dir=out.resolve(), overrides=overrides,
                     per_optimizer=per_opt, per_model_size=per_size, launcher=launcher, name=str(raw.get("name") or sweep_file.stem))

    # Seeds outermost: a half-finished sweep already holds one complete seed of every optimizer x size.
    for seed in seeds:
        for size in sizes:
            for mult in (mults or [None]):
                for opt in optimizers:
                    args = [str(base)] + to_tokens(overrides) + to_tokens(per_size.get(size) or {}) \
                        + to_tokens(per_opt.get(opt) or {})
                    args += ["--optimizer", opt, "--model_size", size, "--seed", str(seed)]
                    rid = run_id_for(opt, size, seed, None if mult is None else float(mult))
                    if "run_name" not in overrides:
                        args += ["--run_name", rid]
                    spec.runs.append(RunSpec(rid, opt, size, int(seed), None if mult is None else float(mult), args))
    return spec


def validate_runs(spec: SweepSpec) -> None:
    """Parse every run's arguments in-process (hf_optbench.config.parse_args) before launching anything, and
    resolve each run's learning rate where a multiplier applies. Raises OptBenchError naming the run.

    Keys and values are checked here, hardware where the run runs: on a machine without CUDA (a laptop, a SLURM
    login node) the probe adds ``--use_cpu true`` so that TrainingArguments accepts a GPU recipe's bf16/fp16."""
    import torch

    from .config import parse_args

    probe_root = spec.output_dir / ".validate-never-created"
    hardware = [] if torch.cuda.is_available() else ["--use_cpu", "true"]
    for run in spec.runs:
        try:
            cfg = parse_args(run.args + ["--output_dir", str(probe_root / run.run_id)] + hardware)
            if run.lr_multiplier is not None:
                from .run import resolve_hyperparameters

                base_lr = resolve_hyperparameters(cfg)["learning_rate"]["value"]
                run.learning_rate = float(base_lr) * run.lr_multiplier
            run.max_steps = int(cfg.training.max_steps)
        except OptBenchError as exc:
            raise OptBenchError(f"sweep run '{run.run_id}': {exc}") from exc
    for run in spec.runs:
        if run.learning_rate is not None:
            run.args = run.args + ["--learning_rate", f"{run.learning_rate:.6g}"]


# --------------------------------------------------------------------------------------------------- state
def append_state(path: Path, row: dict[str, Any]) -> None:
    """Append one JSON line with a single O_APPEND write (a crash leaves at most a torn last line, which
    :func:`read_state` skips) and fsync it."""
    data = (json.dumps(row, sort_keys=True, default=str) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_state(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if not path.is_file():
        return rows
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn line from a killed writer
    return rows


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def finished_status(run_dir: Path, rows: Sequence[dict[str, Any]], run_id: str) -> str | None:
    """The final status of a run, or None when it still has to run. summary.json is the truth; a crash that
    left none is final when the sweep recorded its end for the current directory."""
    summary = read_summary(run_dir)
    if summary and summary.get("status") in FINAL_STATUSES:
        return str(summary["status"])
    ends = [r for r in rows if r.get("run_id") == run_id and r.get("event") == "end"]
    moved = [r for r in rows if r.get("run_id") == run_id and r.get("event") == "moved"]
    if ends and ends[-1].get("status") in FINAL_STATUSES and run_dir.is_dir():
        if not moved or ends[-1].get("time", 0) > moved[-1].get("time", 0):
            return str(ends[-1]["status"])
    return None


def classify_outcome(run_dir: Path, returncode: int | None, log_tail: str) -> tuple[str, str | None]:
    """(status, error) of an ended process: summary.json if it says completed/diverged, else failed or oom."""
    summary = read_summary(run_dir) or {}
    status = summary.get("status")
    if status in SUCCESS_STATUSES:
        return str(status), None
    oom = status == "oom" or bool(OOM_PATTERN.search(log_tail)) or bool(OOM_PATTERN.search(str(summary.get("error"))))
    error = summary.get("error")
    if not error:
        tail = "\n".join(log_tail.strip().splitlines()[-15:])
        how = f"killed by signal {-returncode}" if returncode is not None and returncode < 0 else \
            f"exit code {returncode}"
        error = f"{how}; no summary.json. Last output:\n{tail}"
    return ("oom" if oom else "failed"), str(error)


def _tail(path: Path, nbytes: int = 8000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - nbytes))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _last_step(run_dir: Path) -> int | None:
    for line in reversed(_tail(run_dir / "metrics.jsonl", 4000).splitlines()):
        try:
            return int(json.loads(line)["step"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return None


@contextmanager
def sweep_lock(output_dir: Path) -> Iterator[None]:
    """One sweep process per directory: an flock, released by the kernel even on SIGKILL."""
    output_dir.mkdir(parents=True, exist_ok=True)
    fh = open(output_dir / "sweep.lock", "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "?"
        fh.close()
        raise OptBenchError(f"another sweep process ({holder}) is running in '{output_dir}'. Wait for it, or "
                            "stop it, before starting this sweep again.") from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    fh.flush()
    try:
        yield
    finally:
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


# ---------------------------------------------------------------------------------------------- processes
def kill_tree(pid: int, create_time: float | None = None, grace_s: float = 10.0) -> bool:
    """Terminate a run's process tree (SIGTERM, then SIGKILL). With ``create_time``, only if ``pid`` is still
    the process we started (pids are reused). Returns True when something was killed."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 1.0:
            return False
        procs = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return False
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return True


def _orphans(run_dir: Path) -> list[int]:
    """Processes of an earlier sweep still working in ``run_dir`` (found by the environment marker)."""
    import psutil

    found = []
    target = str(run_dir)
    for proc in psutil.process_iter(["pid", "uids"]):
        try:
            if proc.info["uids"] and proc.info["uids"].real != os.getuid():
                continue
            if proc.pid != os.getpid() and proc.environ().get(RUN_DIR_ENV) == target:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def build_command(spec: SweepSpec, run: RunSpec, run_dir: Path, resume: bool) -> list[str]:
    """The argv that starts one run."""
    args = list(run.args) + ["--output_dir", str(run_dir)]
    if resume:
        args += ["--resume_from_checkpoint", "true"]
    kind = spec.launcher["type"]
    if kind == "accelerate":
        return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                spec.launcher["accelerate_config"], "-m", "hf_optbench.run", *args]
    if kind == "python":
        return [sys.executable, "-m", "hf_optbench.run", *args]
    prefix = [sys.executable if str(c) == "{python}" else str(c) for c in spec.launcher["command"]]
    return prefix + args


def run_env(spec: SweepSpec, run_dir: Path) -> dict[str, str]:
    """Variables added to the environment where the run starts (a SLURM node keeps its own SLURM_*/CUDA_*)."""
    env = {str(k): str(v) for k, v in _mapping(spec.launcher.get("env"), "launcher.env").items()}
    env["PYTHONUNBUFFERED"] = "1"
    env[RUN_DIR_ENV] = str(run_dir)
    return env


def execute(cmd: list[str], log_path: str, env_extra: dict[str, str], cwd: str,
            timeout_s: float | None = None, on_start: Callable[[Any], None] | None = None,
            on_poll: Callable[[], None] | None = None, poll_s: float = 1.0) -> int:
    """Run one command with stdout+stderr appended to ``log_path``; the run gets its own session so that its
    whole tree can be stopped (and so that a terminal's Ctrl-C reaches it only through the sweep).
    Also the function a SLURM job runs on its node (it must be a picklable top-level function)."""
    with open(log_path, "ab") as log:
        log.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env_extra}, cwd=cwd,
                                start_new_session=True)
        if on_start:
            on_start(proc)
        started = time.monotonic()
        try:
            while True:
                try:
                    return proc.wait(timeout=poll_s)
                except subprocess.TimeoutExpired:
                    if timeout_s and time.monotonic() - started > timeout_s:
                        kill_tree(proc.pid, grace_s=5)
                        log.write(f"\n===== sweep: timed out after {timeout_s:g} s, killed\n".encode())
                        proc.wait()
                        return -9
                    if on_poll:
                        on_poll()
        except BaseException:
            kill_tree(proc.pid, grace_s=10)  # interrupted sweep: leave no run behind
            raise


# ------------------------------------------------------------------------------------------------ progress
def _children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _hms(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """Runs done/total, the current run, elapsed and ETA on the terminal (one line per event: logs stay
    readable when the output is a file). ETA: the mean duration of this invocation's runs of the same model
    size (else of all runs) times what is left."""

    def __init__(self, total: int, done: int, stream: Any = None) -> None:
        self.total, self.done, self.stream = total, done, stream or sys.stdout
        self.t0 = time.monotonic()
        self.durations: dict[str, list[float]] = {}

    def eta(self, pending: Sequence[RunSpec]) -> float | None:
        everything = [d for ds in self.durations.values() for d in ds]
        if not everything:
            return None
        mean_all = sum(everything) / len(everything)
        return sum((sum(self.durations[r.model_size]) / len(self.durations[r.model_size]))
                   if r.model_size in self.durations else mean_all for r in pending)

    def say(self, msg: str) -> None:
        print(f"[sweep {self.done}/{self.total} | {_hms(time.monotonic() - self.t0)}] {msg}", file=self.stream,
              flush=True)

    def started(self, run: RunSpec, pending: Sequence[RunSpec], note: str = "") -> None:
        eta = self.eta(pending)
        self.say(f"running {run.run_id}{note} (ETA {_hms(eta) if eta is not None else '?'})")

    def ended(self, run: RunSpec, status: str, duration: float, detail: str = "") -> None:
        self.done += 1
        self.durations.setdefault(run.model_size, []).append(duration)
        self.say(f"{run.run_id}: {status} in {duration:.1f} s{detail}")


# --------------------------------------------------------------------------------------------------- sweep
def _prepare_run_dir(spec: SweepSpec, run: RunSpec, state: Path, rows: list[dict[str, Any]],
                     progress: Progress) -> bool:
    """Make ``run_dir`` ready for a new attempt; returns whether to resume from a checkpoint.
    Orphaned processes of a killed sweep are stopped first; a directory is moved aside, never deleted."""
    run_dir = spec.run_dir(run)
    for row in reversed(rows):  # the last start of this run, if it has no end
        if row.get("run_id") == run.run_id and row.get("event") in ("start", "end"):
            if row["event"] == "start" and row.get("pid") and row.get("host") == socket.gethostname():
                if kill_tree(int(row["pid"]), row.get("pid_create_time")):
                    progress.say(f"stopped a process of an earlier sweep still running {run.run_id}")
            break
    for pid in _orphans(run_dir):
        kill_tree(pid)
    if not run_dir.exists():
        return False
    status = (read_summary(run_dir) or {}).get("status")
    if any(run_dir.glob("checkpoint-*")) and status not in SUCCESS_STATUSES:
        if status is not None:  # a failed attempt's summary must not mark the resumed run as finished
            n = 1
            while (old := run_dir / f"summary.{status}-{n}.json").exists():
                n += 1
            (run_dir / "summary.json").rename(old)
        return True
    n = 1
    while (aside := run_dir.with_name(f"{run.run_id}.incomplete-{n}")).exists():
        n += 1
    run_dir.rename(aside)
    append_state(state, {"event": "moved", "run_id": run.run_id, "from": str(run_dir), "to": str(aside),
                         "time": time.time()})
    return False


def _end_row(run: RunSpec, attempt: int, status: str, error: str | None, rc: int | None, duration: float,
             run_dir: Path) -> dict[str, Any]:
    summary = read_summary(run_dir) or {}
    return {"event": "end", "run_id": run.run_id, "attempt": attempt, "status": status, "error": error,
            "returncode": rc, "duration_s": round(duration, 3), "time": time.time(),
            "final_eval_loss": summary.get("final_eval_loss")}


def _write_manifest(spec: SweepSpec) -> None:
    """The matrix point and arguments of every run (the report and `tune` read it) + a copy of the sweep file."""
    from .run import write_json_atomic

    write_json_atomic(spec.output_dir / MANIFEST_FILE, {
        "name": spec.name, "sweep_file": str(spec.path), "base": str(spec.base), "launcher": spec.launcher,
        "overrides": spec.overrides, "per_optimizer": spec.per_optimizer, "per_model_size": spec.per_model_size,
        "runs": [asdict(r) for r in spec.runs]})
    shutil.copyfile(spec.path, spec.output_dir / "sweep.yaml")


def _refresh_summary(spec: SweepSpec) -> None:
    from .report import load_runs, write_summary_csv

    write_summary_csv(load_runs(spec.output_dir), spec.output_dir / "summary.csv")


def run_sweep(path: str | os.PathLike[str], *, output_dir: str | None = None, dry_run: bool = False,
              max_runs: int | None = None, retry_failed: bool = False, stream: Any = None) -> dict[str, int]:
    """Run (or continue) a sweep. Returns counts by status of every run in the matrix ("pending" for those
    not run). Bad sweep files raise OptBenchError before anything is launched."""
    out_stream = stream or sys.stdout
    spec = load_sweep(path, output_dir)
    if spec.launcher.get("validate", True):
        validate_runs(spec)
    if dry_run:
        rows = read_state(spec.output_dir / STATE_FILE)
        for run in spec.runs:
            status = finished_status(spec.run_dir(run), rows, run.run_id) or "pending"
            print(f"{run.run_id:<40} {status:<10} {' '.join(build_command(spec, run, spec.run_dir(run), False))}",
                  file=out_stream)
        return _counts(spec, rows)
    with sweep_lock(spec.output_dir):
        spec.runs_dir.mkdir(parents=True, exist_ok=True)
        _write_manifest(spec)
        state = spec.output_dir / STATE_FILE
        rows = read_state(state)
        todo, done = [], 0
        for run in spec.runs:
            status = finished_status(spec.run_dir(run), rows, run.run_id)
            if status is None or (retry_failed and status in ("failed", "oom")):
                todo.append(run)
            else:
                done += 1
        progress = Progress(len(spec.runs), done, out_stream)
        progress.say(f"{spec.name}: {len(spec.runs)} runs, {done} already finished, {len(todo)} to run "
                     f"-> {spec.output_dir}")
        if max_runs is not None:
            todo = todo[:max_runs]
        if spec.launcher["executor"] == "slurm":
            _run_slurm(spec, todo, state, rows, progress)
        else:
            _run_local(spec, todo, state, rows, progress)
        rows = read_state(state)
        _refresh_summary(spec)
        counts = _counts(spec, rows)
        progress.say("finished: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        return counts


def _counts(spec: SweepSpec, rows: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for run in spec.runs:
        status = finished_status(spec.run_dir(run), rows, run.run_id) or "pending"
        counts[status] = counts.get(status, 0) + 1
    return counts


def _attempt(rows: list[dict[str, Any]], run_id: str) -> int:
    return 1 + sum(1 for r in rows if r.get("run_id") == run_id and r.get("event") in ("start", "submitted"))


def _run_local(spec: SweepSpec, todo: list[RunSpec], state: Path, rows: list[dict[str, Any]],
               progress: Progress) -> None:
    for i, run in enumerate(todo):
        _run_one_local(spec, run, todo[i:], state, rows, progress)
        _refresh_summary(spec)


def _run_one_local(spec: SweepSpec, run: RunSpec, pending: list[RunSpec], state: Path, rows: list[dict[str, Any]],
                   progress: Progress) -> None:
    """One attempt of one run in a child process, with its start and end recorded in the state file."""
    timeout_s = spec.launcher.get("timeout_s")
    interval = float(spec.launcher.get("progress_interval_s") or 60)
    resume = _prepare_run_dir(spec, run, state, rows, progress)
    run_dir = spec.run_dir(run)
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = build_command(spec, run, run_dir, resume)
    attempt = _attempt(rows, run.run_id)
    progress.started(run, pending, " (resuming from its last checkpoint)" if resume else "")
    t0 = time.monotonic()
    cpu0 = _children_cpu_s()
    last_note = [t0]

    def on_start(proc: Any) -> None:
        import psutil

        row = {"event": "start", "run_id": run.run_id, "attempt": attempt, "pid": proc.pid,
               "pid_create_time": psutil.Process(proc.pid).create_time(), "host": socket.gethostname(),
               "command": cmd, "resume": resume, "time": time.time()}
        append_state(state, row)
        rows.append(row)

    def on_poll() -> None:
        now = time.monotonic()
        if now - last_note[0] >= interval:
            last_note[0] = now
            step = _last_step(run_dir)
            of = f"/{run.max_steps}" if run.max_steps else ""
            progress.say(f"  {run.run_id}: step {step if step is not None else '?'}{of}, {now - t0:.0f} s")

    rc = execute(cmd, str(run_dir / "stdout.log"), run_env(spec, run_dir), os.getcwd(), timeout_s,
                 on_start, on_poll)
    status, error = classify_outcome(run_dir, rc, _tail(run_dir / "stdout.log"))
    if timeout_s and rc == -9 and status == "failed":
        error = f"timed out after {timeout_s} s (launcher.timeout_s). " + (error or "")
    row = _end_row(run, attempt, status, error, rc, time.monotonic() - t0, run_dir)
    row["cpu_s"] = round(_children_cpu_s() - cpu0, 2)  # user + sys of the run's processes
    append_state(state, row)
    rows.append(row)
    loss = row.get("final_eval_loss")
    progress.ended(run, status, time.monotonic() - t0,
                   f", final eval loss {loss:.4f}" if isinstance(loss, (int, float)) else
                   (f": {error.splitlines()[0][:160]}" if error else ""))


def _slurm_executor(spec: SweepSpec) -> Any:
    try:
        import submitit
    except ImportError as exc:
        raise OptBenchError("launcher.executor slurm needs submitit: pip install 'hf_optbench[slurm]'.") from exc
    params = dict(spec.launcher.get("slurm") or {})
    cluster = params.pop("cluster", "slurm")  # "local"/"debug": submitit's stand-ins, to try a sweep file
    executor = submitit.AutoExecutor(folder=spec.output_dir / "submitit" / "%j", cluster=cluster)
    mapped = {(k if k in SUBMITIT_GENERIC or k.startswith(("slurm_", "local_")) else f"slurm_{k}"): v
              for k, v in params.items()}
    try:
        executor.update_parameters(**mapped)
    except (NameError, ValueError, TypeError) as exc:
        raise OptBenchError(f"launcher.slurm: {exc}. Use submitit's parameter names (partition, account, qos, "
                            "gpus_per_node, timeout_min, cpus_per_task, mem_gb, ...).") from exc
    return executor


def _run_slurm(spec: SweepSpec, todo: list[RunSpec], state: Path, rows: list[dict[str, Any]],
               progress: Progress) -> None:
    """One submitit job per run (a job array), then wait and record each outcome. A restarted sweep
    re-attaches to jobs an earlier invocation submitted that are still queued or running."""
    executor = _slurm_executor(spec)
    job_class = executor._executor.job_class  # submitit keeps the job type per cluster here
    jobs: list[tuple[RunSpec, Any, int, float]] = []
    fresh: list[tuple[RunSpec, list[str], int]] = []
    for run in todo:
        last = next((r for r in reversed(rows) if r.get("run_id") == run.run_id
                     and r.get("event") in ("submitted", "end", "start")), None)
        if last and last["event"] == "submitted":
            job = job_class(folder=executor.folder, job_id=str(last["job_id"]))
            if not job.done():
                progress.say(f"re-attached to job {last['job_id']} of {run.run_id}")
                jobs.append((run, job, int(last["attempt"]), time.monotonic()))
                continue
        resume = _prepare_run_dir(spec, run, state, rows, progress)
        run_dir = spec.run_dir(run)
        run_dir.mkdir(parents=True, exist_ok=True)
        fresh.append((run, build_command(spec, run, run_dir, resume), _attempt(rows, run.run_id)))
    if fresh:
        with executor.batch():
            submitted = [(run, executor.submit(execute, cmd, str(spec.run_dir(run) / "stdout.log"),
                                               run_env(spec, spec.run_dir(run)), os.getcwd(),
                                               spec.launcher.get("timeout_s")), attempt, cmd)
                         for run, cmd, attempt in fresh]
        for run, job, attempt, cmd in submitted:
            row = {"event": "submitted", "run_id": run.run_id, "attempt": attempt, "job_id": job.job_id,
                   "command": cmd, "time": time.time()}
            append_state(state, row)
            rows.append(row)
            jobs.append((run, job, attempt, time.monotonic()))
        progress.say(f"submitted {len(submitted)} job(s) to {executor.cluster}: "
                     + ", ".join(str(j.job_id) for _, j, _, _ in submitted[:5]) + (" ..." if len(submitted) > 5 else ""))
    waiting = list(jobs)
    while waiting:
        still = []
        for run, job, attempt, t0 in waiting:
            if not job.done():
                still.append((run, job, attempt, t0))
                continue
            run_dir = spec.run_dir(run)
            rc: int | None
            try:
                rc = int(job.result())
                extra = ""
            except Exception as exc:  # job failed in the scheduler (timeout, pre-emption, node failure)
                rc, extra = None, f"submitit: {type(exc).__name__}: {str(exc)[-1500:]}"
            status, error = classify_outcome(run_dir, rc, _tail(run_dir / "stdout.log") + extra)
            if extra and status not in SUCCESS_STATUSES:
                error = f"{error}\n{extra}"
            row = _end_row(run, attempt, status, error, rc, time.monotonic() - t0, run_dir)
            row["job_id"] = job.job_id
            append_state(state, row)
            rows.append(row)
            progress.ended(run, status, time.monotonic() - t0)
        waiting = still
        if waiting:
            time.sleep(2.0)


# ------------------------------------------------------------------------------------------------------ cli
def cli_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hf-optbench sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_file", help="sweep YAML (see recipes/sweeps/)")
    parser.add_argument("--output-dir", default=None, help="sweep directory (default: the file's output_dir)")
    parser.add_argument("--dry-run", action="store_true", help="validate and print each run's status and command")
    parser.add_argument("--max-runs", type=int, default=None, help="start at most N runs, then stop")
    parser.add_argument("--retry-failed", action="store_true", help="run failed/oom runs again (old dir moved aside)")
    args = parser.parse_args(argv)
    if args.max_runs is not None and args.max_runs < 0:
        raise OptBenchError(f"--max-runs must be >= 0, got {args.max_runs}.")

    def _stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _stop)  # SIGTERM unwinds like Ctrl-C: the run's tree is stopped
    try:
        counts = run_sweep(args.sweep_file, output_dir=args.output_dir, dry_run=args.dry_run,
                           max_runs=args.max_runs, retry_failed=args.retry_failed)
    except KeyboardInterrupt:
        print("[sweep] interrupted: start the same command again to continue", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0 if not set(counts) - {"completed", "diverged", "pending"} else 1


if __name__ == "__main__":
    from .cli import main as _main

    sys.exit(_main(["sweep", *sys.argv[1:]]))
