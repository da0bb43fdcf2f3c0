"""study.slurm: what the sweep hands submitit cannot inject commands into the SLURM job script; where its jobs stand
is read from squeue and scontrol, never sacct; an interrupt cancels the pending jobs only.

submitit writes each launcher.slurm parameter and the log paths under the sweep's output_dir into the job script as
``#SBATCH --key='value'`` lines, quoted with shlex.quote, and the command that starts the job with its folder
quoted the same way. The script is written here through submitit's public API (``submit``, a stub ``sbatch`` keeping
a copy) for names full of shell syntax, and run by bash with a stub ``srun``: nothing they hold runs. A line break,
which ends a ``#SBATCH`` comment line whatever the quoting, is refused before anything is written.

The job states come from stub ``squeue``/``scontrol`` programs here (a stub ``sacct`` fails the test if called);
tests/study/test_slurm_cluster.py runs the same against a real single-node SLURM."""

from __future__ import annotations

import io
import os
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import read_state
from hf_optbench.study.slurm import Ends, _leave, check_job_script_values, slurm_executor
from hf_optbench.study.stopping import IN_FLIGHT, SignalStop
from hf_optbench.study.sweep_state import Progress

submitit = pytest.importorskip("submitit")

NASTY = "sw $(touch PWNED1) `touch PWNED2`; touch PWNED3 'q\" & touch PWNED4 | x > PWNED5"


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _spec(output_dir: Path | str, **slurm) -> SimpleNamespace:
    """The two things of a SweepSpec the SLURM executor reads."""
    return SimpleNamespace(output_dir=Path(output_dir), launcher={"executor": "slurm", "slurm": slurm})


def test_names_full_of_shell_syntax_stay_inside_the_quotes_of_the_job_script(tmp_path: Path, monkeypatch) -> None:
    bin_dir, script = tmp_path / "bin", tmp_path / "job.sh"
    bin_dir.mkdir()
    _stub(bin_dir, "sbatch", 'for last; do :; done\ncp "$last" "$SBATCH_COPY"\necho "Submitted batch job 4242"\n')
    _stub(bin_dir, "srun", 'for a; do printf "%s\\n" "$a"; done\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SBATCH_COPY", str(script))
    out = tmp_path / NASTY
    executor = slurm_executor(_spec(out, partition="gpu; touch PWNED6", name="x$(touch PWNED7)",
                                    comment="`touch PWNED8`", timeout_min=5))
    assert executor.submit(print, "hello").job_id == "4242"
    work = tmp_path / "node"
    work.mkdir()
    ran = subprocess.run(["bash", str(script)], cwd=work, capture_output=True, text=True, timeout=60)
    made = [p.name for p in tmp_path.rglob("PWNED*")]
    assert made == [], (made, script.read_text())
    args = ran.stdout.splitlines()
    assert f"{out}/submitit/%j/%j_%t_log.out" in args  # the folder reaches srun whole, as one argument
    assert args[-2:] == ["submitit.core._submit", f"{out}/submitit/%j"], args
    assert "#SBATCH --partition='gpu; touch PWNED6'" in script.read_text()


@pytest.mark.parametrize("where, spec", [
    ("output_dir", _spec("/tmp/sw\ntouch PWNED")),
    ("launcher.slurm.partition", _spec("/tmp/sw", partition="gpu\ntouch PWNED")),
    ("launcher.slurm.additional_parameters.comment", _spec("/tmp/sw", additional_parameters={"comment": "a\rb"})),
    ("launcher.slurm.srun_args[1]", _spec("/tmp/sw", srun_args=["--x", "y\nz"])),
])
def test_a_line_break_that_would_end_a_script_line_is_refused(where: str, spec: SimpleNamespace) -> None:
    with pytest.raises(OptBenchError, match=rf"^{where.replace('[', '.').replace(']', '.')} holds a "):
        check_job_script_values(spec)


def test_setup_lines_are_shell_by_design_and_a_local_sweep_is_not_checked() -> None:
    check_job_script_values(_spec("/tmp/sw", setup=["module load cuda\nsource env.sh"]))
    check_job_script_values(SimpleNamespace(output_dir=Path("/tmp/a\nb"), launcher={"executor": "local"}))


def _cluster_stubs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """squeue: 7_0 running, 7_1 pending; scontrol: 7_3 ended TIMEOUT, 7_5 COMPLETED, anything else unknown (as an
    array task cancelled while pending is); sacct and scancel leave a trace of their arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir, "squeue", 'printf "7_0|RUNNING\\n7_1|PENDING\\n8|PENDING\\n"\n')
    _stub(bin_dir, "scontrol", 'case "$4" in\n'
                               '  7_3) echo "JobId=9 ArrayJobId=7 ArrayTaskId=3 JobState=TIMEOUT Reason=TimeLimit";;\n'
                               '  7_5) echo "JobId=11 ArrayJobId=7 ArrayTaskId=5 JobState=COMPLETED Reason=None";;\n'
                               '  *) echo "Job $4 not found" >&2; exit 1;;\nesac\n')
    _stub(bin_dir, "sacct", f'echo "$@" >> {tmp_path}/sacct.called; exit 1\n')
    _stub(bin_dir, "scancel", f'echo "$@" >> {tmp_path}/scancel.called\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def _job(tmp_path: Path, job_id: str, result: bool = False) -> SimpleNamespace:
    """What the executor reads of a submitit job: its id and its result file (``done`` would ask sacct)."""
    pickle = tmp_path / f"{job_id}_result.pkl"
    if result:
        pickle.write_bytes(b"done")
    return SimpleNamespace(job_id=job_id, paths=SimpleNamespace(result_pickle=pickle),
                           done=lambda: pytest.fail("submitit's sacct watcher was asked"))


def test_job_states_come_from_squeue_and_scontrol_never_sacct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _cluster_stubs(tmp_path, monkeypatch)
    jobs = [_job(tmp_path, j) for j in ("7_0", "7_1", "7_2", "7_3", "7_5")] + [_job(tmp_path, "7_4", result=True)]
    # queued: not ended; gone and unknown: UNKNOWN (the sweep runs it again); TIMEOUT: a final state; a result file:
    # ended with one; COMPLETED without its result file yet: waited for (a shared file system's delay)
    assert Ends(True).poll(jobs) == {"7_2": "UNKNOWN", "7_3": "TIMEOUT", "7_4": "result"}
    assert not (tmp_path / "sacct.called").exists()


def test_an_interrupt_cancels_the_pending_jobs_and_names_the_running_ones(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _cluster_stubs(tmp_path, monkeypatch)
    monkeypatch.setattr(IN_FLIGHT, "left_running", {})  # this process's record, put back after the test
    waiting = [(SimpleNamespace(run_id=f"run{j}"), _job(tmp_path, j), 1, 0.0) for j in ("7_0", "7_1", "8")]
    state, log = tmp_path / "sweep_state.jsonl", io.StringIO()
    _leave(waiting, True, state, [], Progress(3, 0, log))
    assert (tmp_path / "scancel.called").read_text().split() == ["7_1", "8"]  # never the running one
    assert [(r["event"], r["run_id"], r["job_id"]) for r in read_state(state)] == [
        ("cancelled", "run7_1", "7_1"), ("cancelled", "run8", "8")]
    text = log.getvalue()
    assert "cancelled 2 pending job(s): run7_1 (job 7_1), run8 (job 8)" in text, text
    assert "1 job(s) keep running: run7_0 (job 7_0, RUNNING); the same command re-attaches to them, `scancel 7_0`" \
        in text, text
    # the interrupted sweep's last line (study.stopping) names them instead of "no run was in flight"
    assert "1 SLURM job(s) keep running, run7_0 (job 7_0)" in SignalStop().line()
