"""study.slurm: what the sweep hands submitit cannot inject commands into the SLURM job script.

submitit writes each launcher.slurm parameter and the log paths under the sweep's output_dir into the job script as
``#SBATCH --key='value'`` lines, quoted with shlex.quote, and the command that starts the job with its folder
quoted the same way. The script is written here through submitit's public API (``submit``, a stub ``sbatch`` keeping
a copy) for names full of shell syntax, and run by bash with a stub ``srun``: nothing they hold runs. A line break,
which ends a ``#SBATCH`` comment line whatever the quoting, is refused before anything is written."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from hf_optbench.errors import OptBenchError
from hf_optbench.study.slurm import check_job_script_values, slurm_executor

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
