"""The dependency floors in pyproject.toml hold: every installed dependency is at or above its floor, every API
hf_optbench relies on exists in the installed version, and no floor is below the first release known to have the
APIs hf_optbench uses from that package (so a user at the floor does not meet an AttributeError at step 1).

``since`` is the first release that has the feature, where it was checked in the package's own history (the
repository's release tags); where it could not be checked it is the version this suite runs with, and says so.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]


def _resolve(path: str) -> object:
    """The object at a dotted path: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def _attr(path: str) -> Callable[[], bool]:
    """The dotted object exists."""
    return lambda: _resolve(path) is not None


def _takes(path: str, *params: str) -> Callable[[], bool]:
    """The callable at ``path`` accepts these keyword arguments."""
    return lambda: set(params) <= set(inspect.signature(_resolve(path)).parameters)


def _source_has(path: str, *snippets: str) -> Callable[[], bool]:
    """The source of the object at ``path`` contains these lines (behaviour hf_optbench models, not only names)."""
    return lambda: all(s in inspect.getsource(_resolve(path)) for s in snippets)


def _fused_adamw_on_cpu() -> bool:
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return "cpu" in _get_fused_kernels_supported_devices()


# distribution -> [(what hf_optbench uses and where, first release with it, check)]
FEATURES: dict[str, list[tuple[str, str, Callable[[], bool]]]] = {
    "torch": [
        # pytorch/pytorch#160213 "Introduce Muon optimizer to PyTorch" (merged 2025-08-24): first released in 2.9
        ("torch.optim.Muon (optim/muon_impl.py)", "2.9", _attr("torch.optim.Muon")),
        ("Muon(adjust_lr_fn=) (optim/muon.py)", "2.9", _takes("torch.optim.Muon", "adjust_lr_fn", "ns_steps")),
        ("fused AdamW on CPU (optim/adamw.py)", "2.4", _fused_adamw_on_cpu),
        ("distributed-checkpoint optimizer state dicts (tests/optim/test_state_dict.py)", "2.4",
         _attr("torch.distributed.checkpoint.state_dict.get_optimizer_state_dict")),
    ],
    "pytorch-optimizer": [
        # kozistr/pytorch_optimizer tags: SophiaH.init_group first in v3.6.0 (absent in v3.5.0 and v3.5.1)
        ("SophiaH.init_group (optim/sophia_impl.py)", "3.6.0", _attr("pytorch_optimizer.SophiaH.init_group")),
        # absent through tag v3.9.0; 4.0 not checked: the floor is the version this suite runs with
        ("SophiaH(foreach=) (optim/sophia_impl.py)", "4.1", _takes("pytorch_optimizer.SophiaH", "foreach", "p")),
        ("SOAP (optim/soap.py)", "3.6.0", _attr("pytorch_optimizer.SOAP")),
    ],
    "transformers": [
        ("TrainerCallback.on_optimizer_step (Sophia-G's Hessian estimate)", "5.20",
         _attr("transformers.TrainerCallback.on_optimizer_step")),
        ("optimization.Adafactor (optim/adafactor.py)", "5.20", _attr("transformers.optimization.Adafactor")),
    ],
    "lion-pytorch": [
        ("lion_pytorch.foreach.Lion (optim/lion.py)", "0.2.5", _attr("lion_pytorch.foreach.Lion")),
        ("Lion(decoupled_weight_decay=)", "0.2.5", _takes("lion_pytorch.Lion", "decoupled_weight_decay")),
    ],
    "schedulefree": [
        ("AdamWScheduleFree.train/eval (optim/schedule_free_impl.py)", "1.4",
         _attr("schedulefree.AdamWScheduleFree.eval")),
    ],
    "accelerate": [
        ("AcceleratedOptimizer.train/eval reaching DeepSpeed's inner optimizer", "1.10",
         _source_has("accelerate.optimizer.AcceleratedOptimizer.train", "self.optimizer.optimizer.train")),
    ],
    "bitsandbytes": [
        ("GlobalOptimManager pid2config/index2config/override_config (optim/bnb8bit.py)", "0.50",
         _source_has("bitsandbytes.optim.optimizer.GlobalOptimManager", "pid2config", "index2config",
                     "def override_config")),
    ],
    "deepspeed": [
        ("ZeRO-1/2 flat partitions as measure/planner_zero.py models them", "0.19",
         _source_has("deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer",
                     "self.nccl_start_alignment_factor = 2", "param_group['params'] = [self.single_partition_of")),
    ],
}


def _floors() -> dict[str, Version]:
    """distribution name -> its ``>=`` floor, over the dependencies and every optional extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    floors: dict[str, Version] = {}
    for text in reqs:
        req = Requirement(text)
        if req.name.startswith("hf_optbench"):
            continue
        lows = [Version(s.version) for s in req.specifier if s.operator == ">="]
        if lows:
            floors[req.name.lower().replace("_", "-")] = max(lows)
    return floors


FLOORS = _floors()


def _installed(dist: str) -> Version | None:
    try:
        return Version(importlib.metadata.version(dist))
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.mark.parametrize("dist", sorted(FLOORS))
def test_installed_version_is_at_or_above_its_floor(dist: str) -> None:
    installed = _installed(dist)
    if installed is None:
        pytest.skip(f"{dist} is an optional extra that is not installed")
    assert installed.release >= FLOORS[dist].release, f"{dist} {installed} is below pyproject's floor {FLOORS[dist]}"


@pytest.mark.parametrize("dist", sorted(FEATURES))
def test_features_exist_and_the_floor_is_not_below_them(dist: str) -> None:
    assert dist in FLOORS, f"{dist} is used (FEATURES) but pyproject.toml declares no floor for it"
    if _installed(dist) is None:
        pytest.skip(f"{dist} is an optional extra that is not installed")
    for what, since, check in FEATURES[dist]:
        assert check(), f"{dist} {_installed(dist)} lacks {what}"
        assert FLOORS[dist] >= Version(since), (
            f"pyproject.toml lets {dist} {FLOORS[dist]} install, but {what} first appears in {since}: raise the "
            f"floor to >={since}")
