"""The sweep's protocol as one planner: which runs come next, decided from the runs that have finished.

:func:`plan` yields one :class:`~hf_optbench.study.sweep_session.Batch` at a time, and the sweep runs each before
asking for the next (``while todo := next(planned, None): session.run(todo)``). It composes the rules that live in
their own modules, in the protocol's order:

1. **tuning** (:func:`tuning`): the grid, then what the tuning rule adds from the finished runs (extensions, confirm
   seeds, later axes, rungs: ``study.tuning_phase.tuning_additions``), until it adds none; a run that failed on its only
   attempt runs once more first; then the tuned file (``tuning_phase.tune_phase``) and the comparison reads it;
2. **comparison** and its **attribution runs** (``study.comparison_runs.attribution_phase``); while a compared run
   beats the ladder's top rung (``comparison_runs.ladder_additions``), the new rung's tuning, then the comparison again;
3. **second tuning draw** (``study.second_draw_phase``), once every run so far has ended: the drawn cells' tuning at
   the draw's seed, its tuned file, and the comparison runs whose tuned values it changed.

A phase that stops short (``--max_runs``, a run left unfinished) ends the plan: a restart replays every decision from
the finished runs and continues where it stopped.

The rules only say which runs come next; this module is the one place that adds them to the :class:`SweepSpec`
(whose run lists the sweep's ETA reads as they grow).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

from hf_optbench.rundir import LOST_STATUSES, STATE_FILE, finished_status, read_state
from hf_optbench.study.sweep_manifest import write_manifest
from hf_optbench.study.sweep_session import Batch, SweepSession, todo_runs
from hf_optbench.study.sweep_spec import RunSpec, SweepSpec, attach_tuned_file
from hf_optbench.study.sweep_state import attempt_number


def plan(spec: SweepSpec, session: SweepSession) -> Iterator[Batch]:
    """The sweep's batches in the protocol's order (the module doc); the counts of each land in ``session``."""
    from hf_optbench.study.comparison_runs import attribution_phase, ladder_additions
    from hf_optbench.study.eta import DRAW

    if spec.tuning is not None:
        todo_runs(spec.tuning, session.retry_failed, True, session.rerun_changed,
                  session.teller(""))  # a refusal before anything is written
        write_manifest(spec)  # the whole sweep's file and matrix, before its first (tuning) run
        if not (yield from tuning(spec, session)):  # stopped early: compare later
            session.counts["compare"] = {"pending": len(spec.runs)}
            return
        session.predictor.settle("tune")
        tune_then_attach(spec, session)
    before = len(spec.tuning.runs) if spec.tuning is not None else 0
    while True:
        yield Batch(spec, "compare", session.retry_failed, sweep_copy=True, before=before)
        session.counts.pop("attribution", None)  # this round's, where it has one
        attribution = attribution_phase(spec)
        if attribution is not None:
            yield Batch(attribution, "attribution", session.retry_failed, before=before + len(spec.runs))
        session.predictor.settle("attribution")
        rungs = ladder_additions(spec, session.teller("ladder")) if session.finished("compare", "attribution") else []
        if not rungs:
            session.predictor.settle("compare")
            break
        spec.runs.extend(rungs)
        if spec.tuning is not None:  # the new rung's own learning rate first, as every rung's
            if not (yield from tuning(spec, session)):
                return
            tune_then_attach(spec, session)
    if spec.second_draw is None or not session.finished():
        return
    from hf_optbench.study.second_draw_phase import draw_comparison, draw_spec

    draw = draw_spec(spec)
    session.predictor.begin_draw()
    if not (yield from tuning(draw, session, DRAW + "tune")):
        return
    session.predictor.settle(DRAW + "tune")
    tune_then_attach(draw, session)
    draw.runs = draw_comparison(spec, draw, session.teller("second draw"))
    session.predictor.settle(DRAW + "compare")  # its reruns are known now
    yield Batch(draw, DRAW + "compare", session.retry_failed)


def tuning(spec: SweepSpec, session: SweepSession, key: str = "tune") -> Generator[Batch, None, bool]:
    """The tuning phase as a loop: its pending runs, then the runs the tuner adds from their results
    (study.tuning_phase.tuning_additions), until it adds none; whether it finished. A tuning run that failed (a crash, a
    killed worker) runs once more before its point counts; ``--retry_failed`` also applies to the first pass. A run
    that fails twice is final, its point counts as a rise of the loss, and the tuned file and the report say so
    (study.tuning_phase.tune_phase)."""
    from hf_optbench.study.tuning_phase import tuning_additions

    assert spec.tuning is not None
    retry_failed = session.retry_failed
    while True:
        yield Batch(spec.tuning, key, retry_failed, retry_once=True, later=unfinished(spec))
        if not session.finished(key):  # stopped early: tune and compare later
            return False
        if failed_once(spec.tuning) and session.may_launch():
            session.say("retrying the run(s) that failed on their first attempt, once", "tuning")
            continue
        added = tuning_additions(spec, session.teller("tuning"))
        if not added:
            return True
        spec.tuning.runs.extend(added)
        retry_failed = False


def unfinished(spec: SweepSpec) -> list[RunSpec]:
    """The phase's runs still to run (for the sweep's ETA while an earlier phase runs)."""
    rows = read_state(spec.output_dir / STATE_FILE)
    return [run for run in spec.runs if finished_status(spec.run_dir(run), rows, run.run_id) is None]


def failed_once(spec: SweepSpec) -> list[str]:
    """The runs of a phase that failed (or ran out of memory) on their only attempt."""
    rows = read_state(spec.output_dir / STATE_FILE)
    return [run.run_id for run in spec.runs if finished_status(spec.run_dir(run), rows, run.run_id) in LOST_STATUSES
            and attempt_number(rows, run.run_id) <= 2]


def tune_then_attach(spec: SweepSpec, session: SweepSession) -> None:
    """Select the tuned values, write them (tune_phase checks that every compared optimizer x size has one), and
    point the comparison runs at them."""
    from hf_optbench.study.tuning_phase import tune_phase

    paths, warnings = tune_phase(spec)
    for w in warnings:
        session.say(w, "tuning warning")
    session.say(f"tuned learning rates -> {', '.join(map(str, paths))}")
    attach_tuned_file(spec)
