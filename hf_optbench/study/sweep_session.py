"""One sweep invocation's running state, in one place: where it writes its lines, whether failed runs run again,
the runs ``--max_runs`` leaves it, the progress count and ETA, the warm workers, and each phase's counts by status.
:meth:`SweepSession.run` runs one :class:`Batch` (a phase's pending runs) as the sweep's planner
(:mod:`hf_optbench.study.sweep_plan`) asks for it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hf_optbench.rundir import (
    FINAL_STATUSES,
    LOST_STATUSES,
    STATE_FILE,
    finished_status,
    read_identity,
    read_state,
)
from hf_optbench.study.kept_runs import check_summaries, keep_current
from hf_optbench.study.launch import run_local
from hf_optbench.study.slurm import run_slurm
from hf_optbench.study.sweep_manifest import write_manifest
from hf_optbench.study.sweep_spec import RunSpec, SweepSpec
from hf_optbench.study.sweep_state import Progress, attempt_number
from hf_optbench.study.worker_client import WorkerPool


@dataclass(frozen=True)
class Batch:
    """A phase's runs to launch now, and how: ``key`` names the phase whose counts they are ("tune", "compare",
    "attribution", "draw-tune", "draw-compare"); ``retry_failed`` reruns its failed runs; ``retry_once`` reruns a run
    that failed on its only attempt (tuning: a point lost to a crash must not silently move the tuned value);
    ``sweep_copy`` writes the copy of the sweep file beside the manifest; ``before`` and ``later``: the runs of
    earlier and later phases the progress count and ETA add."""

    phase: SweepSpec
    key: str
    retry_failed: bool = False
    retry_once: bool = False
    sweep_copy: bool = False
    before: int = 0
    later: list[RunSpec] = field(default_factory=list)


def phase_counts(spec: SweepSpec, rows: list[dict[str, Any]]) -> dict[str, int]:
    """The phase's runs by status ("pending": not finished)."""
    counts: dict[str, int] = {}
    for run in spec.runs:
        status = finished_status(spec.run_dir(run), rows, run.run_id) or "pending"
        counts[status] = counts.get(status, 0) + 1
    return counts


def add_counts(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in sorted(set(a) | set(b))}


def todo_runs(spec: SweepSpec, retry_failed: bool, retry_once: bool, rerun_changed: bool,
              say: Callable[[str], None]) -> list[RunSpec]:
    """The runs of a phase to launch: unfinished, failed ones asked to retry, and the finished runs whose settings
    the file changed (refused without ``rerun_changed``: study.kept_runs). Checked before anything is written."""
    check_summaries(spec)
    rows = read_state(spec.output_dir / STATE_FILE)
    todo, interrupted = [], []
    for run in spec.runs:
        status = finished_status(spec.run_dir(run), rows, run.run_id)
        failed = status in LOST_STATUSES
        if status is None or (failed and (retry_failed or (retry_once and attempt_number(rows, run.run_id) <= 2))):
            todo.append(run)
        if status is None and read_identity(spec.run_dir(run)) is not None:  # started, stopped before its end
            interrupted.append(run)
    return keep_current(spec, todo, rerun_changed, say, interrupted)


def refresh_summary(spec: SweepSpec) -> None:
    """summary.csv of the sweep directory, rewritten after every run so that a killed sweep still has one."""
    from hf_optbench.study.records import load_runs, write_summary_csv

    write_summary_csv(load_runs(spec.output_dir), spec.output_dir / "summary.csv")


class SweepSession:
    """What one invocation threads through its phases: its output stream, ``--retry_failed`` and
    ``--rerun_changed``, the runs ``--max_runs`` still allows (None: no limit; one count for every phase), the one
    progress count and ETA (:class:`~hf_optbench.study.sweep_state.Progress`), the warm workers, and each phase's
    last counts by status (:meth:`totals`)."""

    def __init__(self, stream: Any, progress: Progress, pool: WorkerPool | None = None, *, retry_failed: bool = False,
                 rerun_changed: bool = False, max_runs: int | None = None) -> None:
        self.stream, self.progress, self.pool = stream, progress, pool
        self.retry_failed, self.rerun_changed = retry_failed, rerun_changed
        self.runs_left = max_runs
        self.counts: dict[str, dict[str, int]] = {}  # the phase's key -> its runs by status, as it last ran

    @property
    def predictor(self) -> Any:
        """The sweep's ETA predictor (study.eta.Predictor; a stand-in that does nothing where there is none)."""
        return self.progress.predictor

    def say(self, text: str, topic: str = "") -> None:
        """One ``[sweep]`` line (``topic``: what it is about, e.g. "tuning")."""
        print(f"[sweep] {topic + ': ' if topic else ''}{text}", file=self.stream, flush=True)

    def teller(self, topic: str) -> Callable[[str], None]:
        """:meth:`say` about ``topic``, for a planner that says its decisions."""
        return lambda text: self.say(text, topic)

    def may_launch(self) -> bool:
        """Whether ``--max_runs`` leaves a run to launch."""
        return self.runs_left is None or self.runs_left > 0

    def finished(self, *keys: str) -> bool:
        """Whether every run of these phases (all phases run so far, without ``keys``) has a final status."""
        return not any(set(counts) - set(FINAL_STATUSES) for key, counts in self.counts.items()
                       if not keys or key in keys)

    def totals(self) -> dict[str, int]:
        """Every phase's runs by status, added up."""
        out: dict[str, int] = {}
        for counts in self.counts.values():
            out = add_counts(out, counts)
        return out

    def run(self, batch: Batch) -> None:
        """Run (or continue) one phase's runs, at most as many as ``--max_runs`` leaves; record its counts."""
        spec = batch.phase
        todo = todo_runs(spec, batch.retry_failed, batch.retry_once, self.rerun_changed, self.teller(""))
        write_manifest(spec, batch.sweep_copy, relaunch={r.run_id for r in todo})
        state = spec.output_dir / STATE_FILE
        rows = read_state(state)
        done = len(spec.runs) - len(todo)
        queued = {r.run_id for r in todo}
        progress = self.progress
        progress.begin_phase(batch.before, done, len(spec.runs), batch.later, phase=spec,
                             finished=[r for r in spec.runs if r.run_id not in queued])
        progress.say(f"{spec.name}: {len(spec.runs)} runs, {done} already finished, {len(todo)} to run "
                     f"-> {spec.output_dir}")
        if self.runs_left is not None:
            todo = todo[:self.runs_left]
            self.runs_left -= len(todo)
        if todo and spec.launcher["executor"] == "slurm":
            run_slurm(spec, todo, state, rows, progress)
        elif todo:
            run_local(spec, todo, state, rows, progress, after_each=lambda: refresh_summary(spec), pool=self.pool)
        refresh_summary(spec)
        self.counts[batch.key] = counts = phase_counts(spec, read_state(state))
        progress.say("finished: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
