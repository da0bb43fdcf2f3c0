"""The SLURM executor of a sweep (``launcher.executor: slurm``): one submitit job per run, submitted as a job
array, then waited for; each outcome is recorded in the state file as the local executor records it.

submitit (https://github.com/facebookincubator/submitit) pickles :func:`hf_optbench.study.processes.execute` and
runs it on the node, so a run starts there exactly as it starts locally. ``slurm: {cluster: local}`` selects
submitit's local stand-in, to try a sweep file on a machine without SLURM. Only submitit's public API is used
(``AutoExecutor``, ``executor.cluster``/``folder``, ``SlurmJob``/``LocalJob`` to re-attach by job id).

Secrets: submitit writes each job's arguments to a pickle in the sweep directory, so the value of a launcher.env
variable whose name looks secret (and of a secret ``NAME=value`` after a launcher.command's leading ``env``) is not
passed as an argument: it is put in this process's environment while the jobs are submitted, which sbatch
(``--export=ALL``, its default) and submitit's local stand-in hand to each job.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hf_optbench.config.checks import LINE_BREAKS
from hf_optbench.errors import OptBenchError
from hf_optbench.publish.redact import is_secret_name, redact_argv
from hf_optbench.rundir import FINISHED_STATUSES, STDOUT_FILE, append_state
from hf_optbench.study.launch import build_command, prepare_run_dir, run_env
from hf_optbench.study.processes import execute, tail
from hf_optbench.study.sweep_spec import RunSpec, SweepSpec
from hf_optbench.study.sweep_state import Progress, attempt_number, classify_outcome, end_row

# launcher.slurm keys whose values are shell lines by design (submitit's setup/teardown: commands run before and
# after the job, as the user wrote them).
SHELL_LINE_KEYS = ("setup", "teardown", "slurm_setup", "slurm_teardown")
# submitit's cluster-independent parameter names; any other key of launcher.slurm gets the "slurm_" prefix
SUBMITIT_GENERIC = {"name", "timeout_min", "mem_gb", "nodes", "cpus_per_task", "gpus_per_node", "tasks_per_node",
                    "stderr_to_stdout"}

Job = tuple[RunSpec, Any, int, float]  # run, submitit job, attempt, monotonic start


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


def _submit(spec: SweepSpec, executor: Any, todo: list[RunSpec], state: Path, rows: list[dict[str, Any]],
            progress: Progress) -> list[Job]:
    """Re-attach to this sweep's jobs still queued or running; submit the other runs as one job array."""
    reattach = job_class(executor)
    jobs: list[Job] = []
    fresh: list[tuple[RunSpec, list[str], int]] = []
    hidden: dict[str, str] = {}  # secret NAME=value pairs of an `env` command prefix, exported instead (module doc)
    for run in todo:
        last = next((r for r in reversed(rows) if r.get("run_id") == run.run_id
                     and r.get("event") in ("submitted", "end", "start")), None)
        if last and last["event"] == "submitted" and reattach is not None:
            job = reattach(folder=executor.folder, job_id=str(last["job_id"]))
            if not job.done():
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


def _record_end(spec: SweepSpec, job_entry: Job, state: Path, rows: list[dict[str, Any]],
                progress: Progress) -> None:
    run, job, attempt, t0 = job_entry
    run_dir = spec.run_dir(run)
    rc: int | None
    try:
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


def run_slurm(spec: SweepSpec, todo: list[RunSpec], state: Path, rows: list[dict[str, Any]],
              progress: Progress) -> None:
    """One submitit job per run (a job array), then wait and record each outcome. A restarted sweep
    re-attaches to jobs an earlier invocation submitted that are still queued or running."""
    waiting = _submit(spec, slurm_executor(spec), todo, state, rows, progress)
    while waiting:
        still = []
        for entry in waiting:
            if entry[1].done():
                _record_end(spec, entry, state, rows, progress)
            else:
                still.append(entry)
        waiting = still
        if waiting:
            time.sleep(2.0)
