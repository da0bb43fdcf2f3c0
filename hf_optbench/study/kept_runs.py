"""Which finished runs a restarted sweep may keep: only those that ran with the settings its sweep file gives them
now.

Why: a sweep restarts by keeping every run its directory already finished. Edit the file between two invocations
(add an optimizer, change ``warmup_steps`` or ``dropout`` in ``overrides``) and the kept runs were trained with the
old values while the new runs get the new ones; the report would pair the two as one protocol, and the manifest
would list the new values for runs that never ran with them. So each kept run's recorded identity
(``run_identity.json``, the plan's identity, :mod:`hf_optbench.run.plan`: every setting that decides the result) is compared with
the identity its arguments resolve to now, before any run of the phase starts. A run that differs is refused,
naming it and each changed key, unless the user asks to rerun it (``--rerun-changed``): it is then moved aside to
``<run_id>.changed-<n>`` (never deleted) and runs again.

Refused rather than rerun by default: rerunning costs compute the user did not plan, and moves a finished result
out of the report; an edit may also be a mistake. A run directory without an identity (a run from before
identities, or a launcher command that does not write one) cannot be compared and is kept as before.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import STATE_FILE, append_state
from hf_optbench.study.sweep_spec import RunSpec, SweepSpec, probe_run_config, validation_key
from hf_optbench.study.sweep_state import check_run_dir_free

# Identity keys the launcher decides (processes, DeepSpeed stage from accelerate's config): an in-process parse
# cannot see them, so they are not compared here; the report compares them between runs (report.comparability).
LAUNCHER_KEYS = frozenset({"world_size", "zero_stage"})
CHANGED_SUFFIX = "changed"  # <run_id>.changed-<n>: a finished run whose settings the sweep file no longer gives


def changed_runs(spec: SweepSpec, runs: Sequence[RunSpec]) -> dict[str, dict[str, tuple[Any, Any]]]:
    """{run_id: {key: (recorded, now)}} for the runs of ``runs`` whose directory records an identity other than
    the one their arguments give now. One parse per distinct configuration (seeds and run names masked, as in
    validation); a run whose arguments do not parse here is left to its launch, which refuses them."""
    from hf_optbench.run.identity import identity_changes
    from hf_optbench.run.plan import resolve_plan
    from hf_optbench.rundir import read_identity

    now: dict[tuple[str, ...], dict[str, Any] | None] = {}
    out: dict[str, dict[str, tuple[Any, Any]]] = {}
    for run in runs:
        recorded = read_identity(spec.run_dir(run))
        if recorded is None:
            continue
        key = validation_key(run)
        if key not in now:
            try:
                now[key] = dict(resolve_plan(probe_run_config(spec, run)).identity)
            except OptBenchError:
                now[key] = None
        if now[key] is None:
            continue
        changes = identity_changes(recorded, {**now[key], "seed": run.seed})
        changes = {k: v for k, v in changes.items() if k not in LAUNCHER_KEYS}
        if changes:
            out[run.run_id] = changes
    return out


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _leaves(changes: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    """A changed mapping (the resolved schedule, the data) shown by the keys inside it that changed, dotted
    (``schedule.warmup_steps 0.1 -> 2.0``), not as two whole JSON objects."""
    out: dict[str, tuple[Any, Any]] = {}
    for key, (a, b) in changes.items():
        if isinstance(a, dict) and isinstance(b, dict):
            inner = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
            out.update({f"{key}.{k}": v for k, v in _leaves(inner).items()})
        else:
            out[key] = (a, b)
    return out


def refusal(changed: dict[str, dict[str, tuple[Any, Any]]], interrupted: frozenset[str] = frozenset()) -> OptBenchError:
    """One line: the runs, each with its changed keys old -> new, and the three ways out. ``interrupted``: those of
    them that stopped before their end (a resume would refuse them: their checkpoints hold the old training)."""
    changed = {rid: _leaves(c) for rid, c in changed.items()}
    ids = list(changed)
    listed = "; ".join(f"{rid} ({', '.join(f'{k} {_show(a)} -> {_show(b)}' for k, (a, b) in changed[rid].items())})"
                       for rid in ids[:3]) + (f"; and {len(ids) - 3} more" if len(ids) > 3 else "")
    stopped = sum(rid in interrupted for rid in ids)
    what = (f"{len(ids) - stopped} finished run(s) it would keep" if not stopped else
            f"{stopped} interrupted run(s) it would resume" if stopped == len(ids) else
            f"{len(ids) - stopped} finished run(s) it would keep and {stopped} interrupted one(s) it would resume")
    return OptBenchError(
        f"the sweep file now gives other settings to {what}: {listed}. They were "
        "trained with the old values, and a report would pair them with runs at the new ones. Revert the edit, give "
        f"the sweep a new --output_dir, or pass --rerun_changed to move them aside (<run_id>.{CHANGED_SUFFIX}-N, "
        "kept) and run them again."
    )


def move_aside(spec: SweepSpec, run: RunSpec, changes: dict[str, tuple[Any, Any]]) -> str:
    """Move a changed run's directory to ``<run_id>.changed-<n>`` (recorded in the state file as a ``moved``
    event, so its old end row no longer counts); returns the new name."""
    run_dir = spec.run_dir(run)
    check_run_dir_free(run_dir, run.run_id)
    n = 1
    while (aside := run_dir.with_name(f"{run.run_id}.{CHANGED_SUFFIX}-{n}")).exists():
        n += 1
    run_dir.rename(aside)
    append_state(spec.output_dir / STATE_FILE,
                 {"event": "moved", "run_id": run.run_id, "from": str(run_dir), "to": str(aside),
                  "reason": "settings changed: " + ", ".join(sorted(changes)), "time": time.time()})
    return aside.name


def keep_current(spec: SweepSpec, todo: list[RunSpec], rerun_changed: bool, say: Any,
                 interrupted: Sequence[RunSpec] = ()) -> list[RunSpec]:
    """The phase's runs to launch: ``todo``, plus (with ``rerun_changed``) the finished runs whose settings changed,
    moved aside first; without it such a run is refused (:func:`refusal`). ``interrupted``: runs of ``todo`` that
    started and stopped before their end: one whose settings changed would be refused by its own resume (its
    checkpoints hold the old training), so it is refused here the same way, naming --rerun_changed, or with it
    moved aside and started again. Each run is checked once per sweep process: a run launched now runs with the
    file's current settings."""
    pending = {r.run_id for r in todo}
    kept = [r for r in spec.runs if r.run_id not in pending and r.run_id not in spec.current]
    stopped = [r for r in interrupted if r.run_id not in spec.current]
    changed = changed_runs(spec, kept + stopped) if kept or stopped else {}
    if changed and not rerun_changed:
        raise refusal(changed, frozenset(r.run_id for r in stopped))
    for run in kept + stopped:
        if run.run_id in changed:
            aside = move_aside(spec, run, changed[run.run_id])
            say(f"{run.run_id}: its settings changed ({', '.join(sorted(changed[run.run_id]))}): moved aside to "
                f"{aside}, running it again")
    spec.current.update(r.run_id for r in spec.runs)
    return [r for r in spec.runs if r.run_id in pending or r.run_id in changed]


def check_summaries(spec: SweepSpec) -> None:
    """Every run directory's summary.json, where there is one, reads as a JSON object: a truncated one was
    counted as a finished run without figures (the tuner then blamed a missing ``tuning_blocks``). Refused naming
    the file, before any run of the phase starts."""
    from hf_optbench.rundir import SUMMARY_FILE, read_summary

    for run in spec.runs:
        if (spec.run_dir(run) / SUMMARY_FILE).is_file():
            try:
                read_summary(spec.run_dir(run), required=True)
            except OptBenchError as exc:
                raise OptBenchError(f"sweep run '{run.run_id}': {exc} Nothing was launched; with the file restored, "
                                    "or the run directory moved aside (the sweep then runs it again), start the "
                                    "sweep again.") from None


def kept_entries(spec: SweepSpec, relaunch: set[str]) -> dict[str, dict[str, Any]]:
    """The previous manifest's entries of the runs this invocation keeps (finished before it, not launched again):
    what they ran with, which the new manifest keeps, rather than the file's current arguments (an edit of a key
    outside the identity, such as eval_steps, leaves a run kept)."""
    from hf_optbench.rundir import MANIFEST_FILE, finished_status, read_state

    try:
        old = json.loads((spec.output_dir / MANIFEST_FILE).read_text(encoding="utf-8"))["runs"]
        entries = {e["run_id"]: e for e in old}
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: the current arguments then
        return {}
    rows = read_state(spec.output_dir / STATE_FILE)
    return {r.run_id: entries[r.run_id] for r in spec.runs if r.run_id in entries and r.run_id not in relaunch
            and finished_status(spec.run_dir(r), rows, r.run_id) is not None}
