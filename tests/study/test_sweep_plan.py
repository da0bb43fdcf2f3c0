"""The sweep's planner (study.sweep_plan) without launching anything: each batch it asks for is finished by hand,
as a run would leave it, and the next is asked for; the protocol's order, its stops and its words are the sweep's."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

from hf_optbench.study.sweep_plan import plan
from hf_optbench.study.sweep_session import Batch, SweepSession
from hf_optbench.study.sweep_spec import RunSpec, SweepSpec
from hf_optbench.study.sweep_state import Progress

from fixtures.sweep_fixture import tuning_spec


def _finish(phase: SweepSpec, run: RunSpec, best: float) -> None:
    """A tuning run as it ends: its summary.json with a loss whose minimum is at lr multiplier ``best``."""
    d = phase.run_dir(run)
    d.mkdir(parents=True)
    loss = 4.0 + 0.1 * math.log2(float(run.lr_multiplier or 1.0) / best) ** 2
    (d / "summary.json").write_text(json.dumps({
        "status": "completed", "optimizer": run.optimizer, "model_size": run.model_size, "seed": run.seed,
        "learning_rate": run.learning_rate, "final_tuning_loss": loss}))


def _session() -> tuple[SweepSession, io.StringIO]:
    out = io.StringIO()
    return SweepSession(out, Progress(0, 0, out)), out


def test_the_plan_tunes_until_the_rule_adds_nothing_then_compares(tmp_path: Path) -> None:
    spec = tuning_spec(tmp_path, {"lr_multipliers": [1, 2, 4], "seed": [0], "confirm_seeds": [],
                                  "nonmatrix_multipliers": []})
    session, out = _session()
    asked: list[tuple[Batch, int]] = []  # each batch and its phase's runs when it was asked for
    planned = plan(spec, session)
    while (batch := next(planned, None)) is not None:
        asked.append((batch, len(batch.phase.runs)))
        if batch.key == "tune":
            for run in batch.phase.runs:
                if not batch.phase.run_dir(run).exists():
                    _finish(batch.phase, run, best=8.0)
        session.counts[batch.key] = {"completed": len(batch.phase.runs)}
    # the grid, x8 beyond its upper edge, x16 beyond x8 (which brackets x8), then the comparison reading the file
    assert [(b.key, n) for b, n in asked] == [("tune", 3), ("tune", 4), ("tune", 5), ("compare", 1)]
    assert all(b.retry_once for b, _ in asked[:3]) and asked[3][0].sweep_copy and asked[3][0].before == 5
    compared = asked[3][0].phase.runs[0]
    assert compared.args[compared.args.index("--tuned_hparams_file") + 1] == str(spec.tuned_file)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[sweep] tuning: adamw/tiny: best learning rate x4 is at the upper edge")
    assert lines[-1].startswith("[sweep] tuned learning rates -> ")
    assert session.totals() == {"completed": 5 + 1}


def test_a_phase_that_stops_short_ends_the_plan_and_its_later_runs_count_as_pending(tmp_path: Path) -> None:
    spec = tuning_spec(tmp_path, {"lr_multipliers": [1, 2, 4], "seed": [0]}, seeds=(1, 2))
    session, out = _session()
    planned = plan(spec, session)
    first = next(planned)
    session.counts[first.key] = {"completed": 1, "pending": 2}  # --max_runs 1
    assert next(planned, None) is None
    assert session.totals() == {"completed": 1, "pending": 2 + 2} and not session.finished()
    assert not spec.tuned_file.exists()


def test_the_session_counts_each_phase_as_it_last_ran() -> None:
    session, _ = _session()
    session.counts = {"tune": {"completed": 3, "diverged": 1}, "compare": {"completed": 2, "pending": 1}}
    assert session.totals() == {"completed": 5, "diverged": 1, "pending": 1}
    assert session.finished("tune") and not session.finished("compare", "attribution") and not session.finished()
    assert session.may_launch()
    session.runs_left = 0
    assert not session.may_launch()
