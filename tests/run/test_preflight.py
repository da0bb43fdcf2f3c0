"""What a run refuses before torch is imported (issue 39): bf16 on a machine without a GPU (a refusal through `run`
took 16-35 s on a loaded machine where `validate` answered in 0.7 s: torch was imported to find no GPU), also under
`accelerate launch`, and a recipe recorded by a 2-process run rerun on 1 process."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hf_optbench.machine import gpu_visible

ROOT = Path(__file__).resolve().parents[2]
LARGE = str(ROOT / "recipes" / "lion_gpt2_large.yaml")
NO_GPU = pytest.mark.skipif(gpu_visible(), reason="a GPU is visible here: the bf16 check needs torch")
# The run's own entry point in a fresh interpreter; prints (rc, whether torch was imported) after its stderr.
RUN = ("import sys; from hf_optbench.run.train import main; rc = main(sys.argv[1:]);"
       "print(rc, 'torch' in sys.modules)")


def _run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUN, *argv], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=env)


@NO_GPU
def test_the_headline_recipe_is_refused_without_importing_torch(tmp_path: Path) -> None:
    proc = _run(LARGE, "--output_dir", str(tmp_path / "out"))
    assert proc.stdout.split() == ["2", "False"], proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and "bf16 true" in line and "no GPU" in line and "--bf16 false" in line
    assert "--use_cpu true" in line  # the other override that runs it here (bf16 as the CPU's autocast)


def test_a_two_process_recipe_on_one_process_is_refused_naming_both(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    line = "accelerate launch --config_file accelerate_configs/cpu_ddp2.yaml -m hf_optbench.run runs/x/config.yaml"
    config.write_text(f"# Resolved configuration of this run. Rerun it with\n#   {line} --output_dir NEW_DIR\n"
                      "model_size: tiny\nnum_processes: 2\n")
    proc = _run(str(config), "--output_dir", str(tmp_path / "out"))
    assert proc.stdout.split() == ["2", "False"], proc.stdout
    (err,) = proc.stderr.strip().splitlines()
    assert "num_processes 2" in err and "this run has 1" in err and line in err and "--num_processes 1" in err
    assert not (tmp_path / "out").exists()


def test_parse_checks_the_number_of_processes_too(tmp_path: Path) -> None:
    """validate --full and every caller of parse_args, not only a run's preflight."""
    from hf_optbench.config.parse import parse_args
    from hf_optbench.errors import OptBenchError

    recipe = ROOT / "recipes" / "quickstart_cpu.yaml"
    with pytest.raises(OptBenchError, match="sets num_processes 4 .* this run has 1"):
        parse_args([str(recipe), "--output_dir", str(tmp_path / "o"), "--num_processes", "4"])
    assert parse_args([str(recipe), "--output_dir", str(tmp_path / "o"), "--num_processes", "1"]).run.num_processes == 1


@NO_GPU
@pytest.mark.slow
def test_the_headline_command_through_accelerate_launch_says_one_line_of_its_own(tmp_path: Path) -> None:
    """`accelerate launch -m hf_optbench.run recipes/lion_gpt2_large.yaml` on a CPU: our process writes exactly
    one line and exits 2 before torch. accelerate itself prints its defaults warning (no config file) and, for any
    non-zero exit of its script, a CalledProcessError traceback unless given --quiet: those lines are the
    launcher's, which the launched script cannot change."""
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    if accelerate is None:
        pytest.skip("accelerate's command is not installed")
    proc = subprocess.run([accelerate, "launch", "--quiet", "-m", "hf_optbench.run", LARGE, "--output_dir",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    ours = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode != 0 and len(ours) == 1 and "bf16 true" in ours[0], proc.stderr
    assert "--use_cpu true" in ours[0], ours[0]
    assert "Traceback" not in proc.stderr, proc.stderr
