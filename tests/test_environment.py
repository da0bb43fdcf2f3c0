"""environment.yml reproduces the README's install: same packages as pyproject.toml, pins inside its ranges."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    own = canonicalize_name(project["name"])
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project.get("optional-dependencies", {}).values():
        reqs += [Requirement(r) for r in extra]
    return {canonicalize_name(r.name): r for r in reqs if canonicalize_name(r.name) != own}


def _environment() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text(encoding="utf-8"))


def _pip_lines(env: dict) -> list[str]:
    pips = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pips) == 1, "environment.yml must have exactly one pip: section"
    return pips[0]


def _environment_pins() -> dict[str, Requirement]:
    pins = {}
    for line in _pip_lines(_environment()):
        if line.startswith("-"):  # pip options such as `-e .`
            continue
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name not in pins, f"{req.name} is listed twice in environment.yml"
        pins[name] = req
    return pins


def test_environment_names_the_same_packages_as_pyproject() -> None:
    pyproject, env = set(_pyproject_requirements()), set(_environment_pins())
    assert env == pyproject, (
        f"only in pyproject.toml: {sorted(pyproject - env)}; only in environment.yml: {sorted(env - pyproject)}"
    )


def _exact_version(req: Requirement) -> str | None:
    """The version of a `name==X` pin; None for a range, a bare name or several specifiers."""
    specs = list(req.specifier)
    return specs[0].version if len(specs) == 1 and specs[0].operator == "==" else None


def test_every_pin_is_exact_and_inside_pyprojects_range() -> None:
    wanted = _pyproject_requirements()
    for name, pin in _environment_pins().items():
        version = _exact_version(pin)
        assert version is not None, f"{name}: pin one exact version (name==X), got '{pin}'"
        assert wanted[name].specifier.contains(version, prereleases=True), (
            f"{name}=={version} in environment.yml is outside pyproject.toml's '{wanted[name].specifier}'"
        )


def test_torch_pin_matches_constraints_and_python_matches_requires_python() -> None:
    constraints = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            constraints[canonicalize_name(req.name)] = req
    pins = _environment_pins()
    for name, req in constraints.items():
        assert str(pins[name].specifier) == str(req.specifier), f"{name}: environment.yml and constraints.txt differ"

    env = _environment()
    pythons = [d for d in env["dependencies"] if isinstance(d, str) and re.match(r"python\b", d)]
    assert len(pythons) == 1, "environment.yml must pin python once"
    version = pythons[0].split("=", 1)[1].lstrip("=")
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    from packaging.specifiers import SpecifierSet

    assert SpecifierSet(requires).contains(version), f"python {version} is outside requires-python {requires}"


def test_the_checkout_itself_is_installed_editable() -> None:
    options = [line for line in _pip_lines(_environment()) if line.startswith("-")]
    assert options == ["-e ."], f"expected exactly `-e .` among the pip options, got {options}"


@pytest.mark.parametrize(("line", "expected"), [("torch==2.13.0", "2.13.0"), ("torch>=2.0", None), ("numpy", None),
                                               ("numpy==2.0,<3", None)])
def test_exact_version_rule(line: str, expected: str | None) -> None:
    assert _exact_version(Requirement(line)) == expected
