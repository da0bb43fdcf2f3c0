"""The SLURM executor of a sweep (``launcher.executor: slurm``): one submitit job per run, submitted as a job
array, then waited for; each outcome is recorded in the state file as the local executor records it.

submitit (https://github.com/facebookincubator/submitit) pickles :func:`hf_optbench.study.processes.execute` and
runs it on the node, so a run starts there exactly as it starts locally. ``slurm: {cluster: local}`` selects
submitit's local stand-in, to try a sweep file on a machine without SLURM. Only submitit's public API is used
(``AutoExecutor``, ``executor.cluster``/``folder``, ``SlurmJob``/``LocalJob`` to re-attach by job id).

Where the jobs stand is asked of SLURM with ``squeue`` and ``scontrol``, not with submitit's watcher, which calls
``sacct``: a cluster without accounting storage (a small or single-machine one) has no ``sacct``, and submitit then
warns on every poll and never sees a job cancelled while pending end. A job that leaves the queue without a result
and without failing by itself (``scancel``) is not counted and runs again at the next invocation; Ctrl-C cancels the
pending jobs and names the running ones, which a restart re-attaches to. docs/SLURM.md tries it all on one machine.

Secrets: submitit writes each job's arguments to a pickle in the sweep directory, so the value of a launcher.env
variable whose name looks secret (and of a secret ``NAME=value`` after a launcher.command's leading ``env``) is not
passed as an argument: it is put in this process's environment while the jobs are submitted, which sbatch
(``--export=ALL``, its default) and submitit's local stand-in hand to each job.
"""

from __future__ import annotations

import getpass
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hf_optbench.config.checks import LINE_BREAKS
from hf_optbench.errors import OptBenchError
from hf_optbench.publish.redact import is_secret_name, redact_argv
from hf_optbench.rundir import FINISHED_STATUSES, STDOUT_FILE, append_state
from hf_optbench.study.launch import build_command, prepare_run_dir, run_env
from hf_optbench.study.processes import execute, tail
from hf_optbench.study.stopping import IN_FLIGHT
from hf_optbench.study.sweep_spec import RunSpec, SweepSpec
from hf_optbench.study.sweep_state import Progress, attempt_number, classify_outcome, end_row

# launcher.slurm keys whose values are shell lines by design (submitit's setup/teardown: commands run before and
# after the job, as the user wrote them).
SHELL_LINE_KEYS = ("setup", "teardown", "slurm_setup", "slurm_teardown")
# submitit's cluster-independent parameter names; any other key of launcher.slurm gets the "slurm_" prefix
SUBMITIT_GENERIC = {"name", "timeout_min", "mem_gb", "nodes", "cpus_per_task", "gpus_per_node", "tasks_per_node",
                    "stderr_to_stdout"}

Job = tuple[RunSpec, Any, int, float]  # run, submitit job, attempt, monotonic start
POLL_S = 2.0  # between two looks at the queue (one squeue call for all of a sweep's jobs)
# How long a job SLURM says COMPLETED may take to show its result file (a shared file system's attribute cache)
RESULT_GRACE_S = 30.0
# States a job leaves the queue in without having failed by itself: the run is not counted, the next invocation
# of the sweep runs it again. UNKNOWN: SLURM no longer knows the job (purged, or an array task cancelled pending).
RERUN_STATES = ("CANCELLED", "PREEMPTED", "REVOKED", "UNKNOWN")
PENDING_STATES = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED")


def _texts(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """(where, text) for every string a launcher.slurm value holds (lists and mappings walked)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _texts(key, f"{where} (a key)")
            yield from _texts(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _texts(item, f"{where}[{i}]")
    elif value is not None:
        yield where, str(value)


def check_job_script_values(spec: SweepSpec) -> None:
    """Refuse (exit 2, before anything is written or submitted) a value that would break out of the job script
    submitit writes for SLURM: a line break (or a carriage return or NUL) in the sweep's output_dir or in any
    launcher.slurm parameter but setup/teardown. Why: submitit writes each parameter, and the log paths under
    output_dir, as a ``#SBATCH --key='value'`` comment line, quoted with ``shlex.quote`` (so spaces, ``$(...)``,
    backticks, ``;`` and quotes stay inside the quotes: tests/study/test_slurm.py runs such a script), but a
    line break ends the comment and the rest of the value runs as a command on the node. The command itself is
    pickled, never written into the script."""
    if spec.launcher.get("executor") != "slurm":
        return
    params = dict(spec.launcher.get("slurm") or {})
    values = [("output_dir", str(spec.output_dir)), *((w, t) for key, v in params.items()
                                                      if key not in SHELL_LINE_KEYS
                                                      for w, t in _texts(v, f"launcher.slurm.{key}"))]
    for where, text in values:
        bad = next((c for c in LINE_BREAKS if c in text), None)
        if bad is not None:
            raise OptBenchError(f"{where} holds a {LINE_BREAKS[bad]} ({text[:60]!r}), which would end a line of the SLURM "
                                "job script submitit writes and run the rest as a shell command. Remove it (commands "
                                "to run before the job go in launcher.slurm.setup).")


def slurm_executor(spec: SweepSpec) -> Any:
    """A submitit AutoExecutor with launcher.slurm's parameters (OptBenchError for an unknown one, or for a value
    that would break out of the job script: :func:`check_job_script_values`)."""
    check_job_script_values(spec)
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


def job_class(executor: Any) -> Any:
    """submitit's public Job class of the executor's cluster, to re-attach to a job by id; None where submitit has
    none that can be rebuilt from an id (its in-process "debug" cluster: those jobs end before submit returns)."""
    import submitit

    return {"slurm": submitit.SlurmJob, "local": submitit.LocalJob}.get(str(getattr(executor, "cluster", "")))


def job_env(spec: SweepSpec, run: RunSpec) -> tuple[dict[str, str], dict[str, str]]:
    """(environment passed with the job: written to submitit's pickle, secret environment: never written)."""
    env = {**run_env(spec, spec.run_dir(run)), **run.env}
    secret = {k: v for k, v in env.items() if is_secret_name(k)}
    return {k: v for k, v in env.items() if k not in secret}, secret


def hide_env_secrets(cmd: list[str], hidden: dict[str, str]) -> list[str]:
    """``cmd`` without the secret ``NAME=value`` assignments of a leading ``env`` (``launcher.command: [env,
    MY_SECRET=abc, python, ...]``), which go into ``hidden`` to be exported while the jobs are submitted: the
    command is pickled into the sweep directory, the environment is not."""
    if not cmd or os.path.basename(cmd[0]) != "env":
        return cmd
    out, i = [cmd[0]], 1
    while i < len(cmd) and "=" in cmd[i] and not cmd[i].startswith("-"):
        name, _, value = cmd[i].partition("=")
        if is_secret_name(name):
            hidden[name] = value
        else:
            out.append(cmd[i])
        i += 1
    return out + cmd[i:]


@contextmanager
def exported(env: dict[str, str]) -> Iterator[None]:
    """``env`` in this process's environment for the block (jobs submitted inside inherit it), then restored."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def on_cluster(executor: Any) -> bool:
    """Whether the executor submits to a real SLURM (not submitit's local or in-process stand-ins)."""
    return str(getattr(executor, "cluster", "")) == "slurm"


def queued_states(job_ids: Sequence[str]) -> dict[str, str] | None:
    """{job id: state} of those of ``job_ids`` still in the queue (pending, running, completing, ...), from one
    ``squeue`` call (array tasks one per line: ``-r``); None when squeue could not be asked (try again later).
    Why not submitit's own watcher: it asks ``sacct``, which a cluster without accounting storage does not have
    (submitit then logs a warning on every poll, and a job cancelled while pending never counts as done: no
    result file, and no state but UNKNOWN)."""
    try:
        proc = subprocess.run(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i|%T"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    states = dict(line.split("|", 1) for line in proc.stdout.split() if "|" in line)
    return {j: states[j] for j in job_ids if j in states}


def ended_state(job_id: str) -> str:
    """The state SLURM still knows of a job that left the queue (``scontrol show job``: for MinJobAge, 300 s by
    default, after its end; no accounting needed), or "UNKNOWN" (purged, or an array task cancelled while
    pending, which SLURM drops at once)."""
    try:
        proc = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "UNKNOWN"
    found = re.search(r"\bJobState=(\S+)", proc.stdout)
    return found.group(1) if proc.returncode == 0 and found else "UNKNOWN"


class Ends:
    """Which of a sweep's jobs have ended, and how: "result" (submitit's result file is there: the command ran and
    returned, or raised) or the SLURM state a job left the queue in without one (CANCELLED, TIMEOUT, ...). On a
    real SLURM it asks ``squeue`` and ``scontrol``, never ``sacct`` (:func:`queued_states`); on submitit's
    stand-ins, the job's own ``done()``."""

    def __init__(self, cluster: bool) -> None:
        self.cluster = cluster
        self.gone_since: dict[str, float] = {}  # job id -> when it was first seen out of the queue, result pending

    def poll(self, jobs: Sequence[Any]) -> dict[str, str]:
        """{job id: how it ended} for those of ``jobs`` that have (none when the queue could not be read)."""
        if not self.cluster:
            return {job.job_id: "result" for job in jobs if job.done()}
        queued = queued_states([job.job_id for job in jobs])
        if queued is None:
            return {}
        out = {}
        for job in jobs:
            if job.paths.result_pickle.exists():
                out[job.job_id] = "result"
            elif job.job_id not in queued:
                state = ended_state(job.job_id).split("+")[0]
                # a completed job's result file may show up on a shared file system a moment after the job ends
                first = self.gone_since.setdefault(job.job_id, time.monotonic())
                if state not in ("COMPLETED", "COMPLETING") or time.monotonic() - first > RESULT_GRACE_S:
                    out[job.job_id] = state
        return out


def _submit(spec: SweepSpec, executor: Any, todo: list[RunSpec], state: Path, rows: list[dict[str, Any]],
            progress: Progress) -> list[Job]:
    """Re-attach to this sweep's jobs still queued or running; submit the other runs as one job array."""
    reattach = job_class(executor)
    queued = queued_states([str(r["job_id"]) for r in rows if r.get("event") == "submitted"]) \
        if on_cluster(executor) else None
    jobs: list[Job] = []
    fresh: list[tuple[RunSpec, list[str], int]] = []
    hidden: dict[str, str] = {}  # secret NAME=value pairs of an `env` command prefix, exported instead (module doc)
    for run in todo:
        last = next((r for r in reversed(rows) if r.get("run_id") == run.run_id
                     and r.get("event") in ("submitted", "end", "start", "cancelled")), None)
        if last and last["event"] == "submitted" and reattach is not None:
            job = reattach(folder=executor.folder, job_id=str(last["job_id"]))
            if (str(last["job_id"]) in queued) if queued is not None else not job.done():
                progress.say(f"re-attached to job {last['job_id']} of {run.run_id}")
                jobs.append((run, job, int(last["attempt"]), time.monotonic()))
                continue
        resume = prepare_run_dir(spec, run, state, rows, progress)
        run_dir = spec.run_dir(run)
        run_dir.mkdir(parents=True, exist_ok=True)
        cmd = hide_env_secrets(build_command(spec, run, run_dir, resume), hidden)
        fresh.append((run, cmd, attempt_number(rows, run.run_id)))
    if not fresh:
        return jobs
    envs = {run.run_id: job_env(spec, run) for run, _, _ in fresh}
    secret = {k: v for _, s in envs.values() for k, v in s.items()} | hidden  # the same for every run
    with exported(secret), executor.batch():
        submitted = [(run, executor.submit(execute, cmd, str(spec.run_dir(run) / STDOUT_FILE),
                                           envs[run.run_id][0], os.getcwd(), spec.launcher.get("timeout_s")),
                      attempt, cmd) for run, cmd, attempt in fresh]
    for run, job, attempt, cmd in submitted:
        row = {"event": "submitted", "run_id": run.run_id, "attempt": attempt, "job_id": job.job_id,
               "command": redact_argv(cmd), "time": time.time()}
        append_state(state, row)
        rows.append(row)
        jobs.append((run, job, attempt, time.monotonic()))
    progress.say(f"submitted {len(submitted)} job(s) to {executor.cluster}: "
                 + ", ".join(str(j.job_id) for _, j, _, _ in submitted[:5]) + (" ..." if len(submitted) > 5 else ""))
    return jobs


def _job_log(job: Any) -> str:
    """The end of the job's own log (submitit's, beside the run's): what SLURM or the node said."""
    return "".join(tail(Path(p), 1500) for p in (job.paths.stderr, job.paths.stdout))


def _record_end(spec: SweepSpec, job_entry: Job, state: Path, rows: list[dict[str, Any]],
                progress: Progress, how: str = "result") -> None:
    """The end row of a job that returned (``how`` "result") or that SLURM ended without a result (``how``: its
    state, TIMEOUT, FAILED, NODE_FAIL, OUT_OF_MEMORY, ...): a final outcome, as a local run's."""
    run, job, attempt, t0 = job_entry
    run_dir = spec.run_dir(run)
    rc: int | None
    try:
        if how != "result":
            raise RuntimeError(f"SLURM job {job.job_id} ended {how}"
                               f"{' (out of memory)' if how == 'OUT_OF_MEMORY' else ''} without a result\n"
                               + _job_log(job))
        rc = int(job.result())
        extra = ""
    except Exception as exc:  # job failed in the scheduler (timeout, pre-emption, node failure)
        rc, extra = None, f"submitit: {type(exc).__name__}: {str(exc)[-1500:]}"
    status, error = classify_outcome(run_dir, rc, tail(run_dir / STDOUT_FILE) + extra)
    if extra and status not in FINISHED_STATUSES:
        error = f"{error}\n{extra}"
    row = end_row(run, attempt, status, error, rc, time.monotonic() - t0, run_dir)
    row["job_id"] = job.job_id
    append_state(state, row)
    rows.append(row)
    progress.ended(run, status, time.monotonic() - t0)


def _record_cancelled(job_entry: Job, how: str, state: Path, rows: list[dict[str, Any]], progress: Progress,
                      say: bool = True) -> None:
    """A job that left the queue without a result and not by its own failure (scancel, pre-emption, purged): a
    "cancelled" row, no end row, so the next invocation of the sweep runs it again, as a local run stopped with
    its sweep."""
    run, job, attempt, _ = job_entry
    row = {"event": "cancelled", "run_id": run.run_id, "attempt": attempt, "job_id": job.job_id, "state": how,
           "time": time.time()}
    append_state(state, row)
    rows.append(row)
    if say:
        progress.say(f"{run.run_id}: job {job.job_id} left the queue without a result ({how}: scancel, pre-emption "
                     "or purged); not counted: the next run of the sweep runs it again")


def _leave(waiting: list[Job], cluster: bool, state: Path, rows: list[dict[str, Any]], progress: Progress) -> None:
    """An interrupted sweep (Ctrl-C, SIGTERM) cancels its jobs still pending (they have not started: nothing is
    lost, and a restart submits them again) and says which keep running: their work goes on, and the same command
    re-attaches to them (or ``scancel`` stops them)."""
    if not cluster or not waiting:
        return
    queued = queued_states([job.job_id for _, job, _, _ in waiting])
    if queued is None:
        progress.say("could not ask squeue which jobs are pending; these may keep running: "
                     + ", ".join(f"{run.run_id} (job {job.job_id})" for run, job, _, _ in waiting))
        return
    pending = [e for e in waiting if queued.get(e[1].job_id) in PENDING_STATES]
    running = [e for e in waiting if e[1].job_id in queued and e not in pending]
    if pending:
        subprocess.run(["scancel", *(job.job_id for _, job, _, _ in pending)], capture_output=True, timeout=60)
        for entry in pending:
            _record_cancelled(entry, "CANCELLED", state, rows, progress, say=False)
        progress.say(f"cancelled {len(pending)} pending job(s): "
                     + ", ".join(f"{run.run_id} (job {job.job_id})" for run, job, _, _ in pending))
    if running:
        IN_FLIGHT.left_running = {**IN_FLIGHT.left_running, **{run.run_id: job.job_id for run, job, _, _ in running}}
        progress.say(f"{len(running)} job(s) keep running: "
                     + ", ".join(f"{run.run_id} (job {job.job_id}, {queued[job.job_id]})" for run, job, _, _ in running)
                     + "; the same command re-attaches to them, `scancel "
                     + " ".join(job.job_id for _, job, _, _ in running) + "` stops them")


def run_slurm(spec: SweepSpec, todo: list[RunSpec], state: Path, rows: list[dict[str, Any]],
              progress: Progress) -> None:
    """One submitit job per run (a job array), then wait and record each outcome. A restarted sweep
    re-attaches to jobs an earlier invocation submitted that are still queued or running. A job that left the
    queue without a result and not by failing (scancel) runs again at the next invocation (:func:`_record_cancelled`);
    an interrupt cancels the pending jobs and names those that keep running (:func:`_leave`)."""
    executor = slurm_executor(spec)
    ends = Ends(on_cluster(executor))
    waiting = _submit(spec, executor, todo, state, rows, progress)
    try:
        while waiting:
            ended = ends.poll([job for _, job, _, _ in waiting])
            for entry in waiting:
                how = ended.get(entry[1].job_id)
                if how in RERUN_STATES:
                    _record_cancelled(entry, how, state, rows, progress)
                elif how is not None:
                    _record_end(spec, entry, state, rows, progress, how)
            waiting = [entry for entry in waiting if entry[1].job_id not in ended]
            if waiting:
                time.sleep(POLL_S)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (study.stopping)
        _leave(waiting, ends.cluster, state, rows, progress)
        raise


def run_job(spec: SweepSpec, cmd: list[str], log: str, env: dict[str, str], timeout_s: float | None,
            say: Callable[[str], None]) -> int | None:
    """``cmd`` as one job of the sweep's cluster, with the runs' own launcher.slurm parameters (so it lands on the
    kind of node they ran on, with their cores: the sweep-end step-time calibration), waited for. Its exit code, or
    None (said) when it ended without one. An interrupt cancels it. Secret-named variables of ``env`` are exported
    while it is submitted, never pickled (module doc)."""
    executor = slurm_executor(spec)
    secret = {k: v for k, v in env.items() if is_secret_name(k)}
    with exported(secret):
        job = executor.submit(execute, cmd, log, {k: v for k, v in env.items() if k not in secret}, os.getcwd(),
                              timeout_s)
    say(f"submitted as job {job.job_id} to {executor.cluster}")
    ends = Ends(on_cluster(executor))
    try:
        while (how := ends.poll([job]).get(job.job_id)) is None:
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        if ends.cluster:
            subprocess.run(["scancel", job.job_id], capture_output=True, timeout=60)
        raise
    if how != "result":
        say(f"job {job.job_id} ended {how} without a result")
        return None
    try:
        return int(job.result())
    except Exception as exc:  # the command could not start on the node; submitit re-raises its error here
        last = (str(exc).strip().splitlines() or ["?"])[-1][:300]
        say(f"job {job.job_id} failed: {type(exc).__name__}: {last}")
        return None
