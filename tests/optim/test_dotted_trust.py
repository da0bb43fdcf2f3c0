"""A dotted-path optimizer is imported from installed packages and PYTHONPATH only, never implicitly from the
working directory, so `python -m hf_optbench.run` and `hf-optbench run` import the same modules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_optbench.errors import OptBenchError
from hf_optbench.optim.dotted import import_module_trusted

ROOT = Path(__file__).resolve().parents[2]
EVIL = '''
import pathlib, torch
pathlib.Path(__file__).with_name("imported.marker").write_text("ran")
class Opt(torch.optim.SGD):
    pass
'''


def _plant(where: Path, name: str) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / f"{name}.py").write_text(EVIL)
    return where / "imported.marker"


def test_a_module_in_the_working_directory_is_not_imported(tmp_path: Path, monkeypatch) -> None:
    marker = _plant(tmp_path, "stray_opt_cwd")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend("")  # what `python -m` does
    monkeypatch.delenv("PYTHONPATH", raising=False)
    with pytest.raises(ModuleNotFoundError):
        import_module_trusted("stray_opt_cwd")
    assert not marker.exists() and "" in sys.path  # sys.path restored


def test_a_module_on_pythonpath_is_imported_on_purpose(tmp_path: Path, monkeypatch) -> None:
    marker = _plant(tmp_path / "mine", "my_opt_pythonpath")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "mine"))
    monkeypatch.syspath_prepend(str(tmp_path / "mine"))
    assert import_module_trusted("my_opt_pythonpath").Opt is not None and marker.exists()


@pytest.mark.slow
def test_python_dash_m_refuses_a_stray_module_before_running_it(tmp_path: Path) -> None:
    marker = _plant(tmp_path, "evil")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "hf_optbench.run", str(ROOT / "recipes/quickstart_cpu.yaml"),
                           "--optimizer", "evil.Opt", "--learning_rate", "1e-3", "--max_steps", "2",
                           "--output_dir", str(tmp_path / "out")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "the working directory is not searched" in proc.stderr
    assert not marker.exists()


def test_the_error_names_the_way_to_use_ones_own_module() -> None:
    from hf_optbench.optim.dotted import _import_optimizer_class

    with pytest.raises(OptBenchError, match="installed or on PYTHONPATH"):
        _import_optimizer_class("no_such_module_here.Opt")
