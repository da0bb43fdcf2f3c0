"""The package's shape, enforced: the layer rule of docs/ARCHITECTURE.md, no import cycle, small modules.

Imports are read from the source (module level and inside functions alike), so a lazy import cannot hide an
upward dependency or a cycle. A module that must break the size limits says why in ``SIZE_EXCEPTIONS``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "hf_optbench"

# Lowest first. A module may import from its own layer or a lower one. Every module belongs to one layer: a new
# top-level module or sub-package must be added here.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("hf_optbench.errors", "hf_optbench.machine", "hf_optbench.rundir", "hf_optbench.yaml_file")),
    ("models", ("hf_optbench.models",)),
    ("publish", ("hf_optbench.publish",)),
    ("optim", ("hf_optbench.optim",)),
    ("config", ("hf_optbench.config",)),
    ("data", ("hf_optbench.data",)),
    ("measure", ("hf_optbench.measure",)),
    ("run", ("hf_optbench.run",)),
    ("study", ("hf_optbench.study",)),
    ("report", ("hf_optbench.report",)),
    ("cli", ("hf_optbench.cli",)),
]
# The package facade (lazy public API) and `python -m hf_optbench` may reach every layer.
FACADES = {"hf_optbench", "hf_optbench.__main__"}
# 400 lines split single concerns over several modules (run/summary + what_ran + provenance, the tuning and table
# modules); 600 lets one concern stay in one module, and a module past it still has to say why.
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
# "module" or "module:function" -> the one-line reason it is larger.
SIZE_EXCEPTIONS: dict[str, str] = {}  # none today: every module fits


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


# resources/ holds data shipped with the package (tokenizers, text, an `evaluate` metric script loaded by path),
# not modules of the package
MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(PKG.rglob("*.py")) if "resources" not in p.relative_to(PKG).parts}


def _is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def _resolve(importer: str, node: ast.ImportFrom | ast.Import) -> set[str]:
    """The hf_optbench modules an import statement loads (a `from pkg import submodule` names the submodule)."""
    if isinstance(node, ast.Import):
        found = set()
        for alias in node.names:
            parts = alias.name.split(".")
            while parts and ".".join(parts) not in MODULES:
                parts.pop()
            if parts and parts[0] == "hf_optbench":
                found.add(".".join(parts))
        return found
    if node.level:
        base = importer.split(".")
        if not _is_package(importer):
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    if module.split(".")[0] != "hf_optbench":
        return set()
    found = {f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in MODULES}
    if len(found) < len(node.names):
        found.add(module)
    return found & set(MODULES)


def _imports(name: str) -> set[str]:
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    deps: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            deps |= _resolve(name, node)
    deps.discard(name)
    # importing hf_optbench.x.y runs hf_optbench/__init__ and hf_optbench/x/__init__ too, but those are packages'
    # own concerns, not a dependency of the importer on the facade
    return {d for d in deps if d != "hf_optbench"}


GRAPH = {name: _imports(name) for name in MODULES}


def layer_of(name: str) -> int:
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if name == prefix or name.startswith(prefix + "."):
                best = index
    assert best is not None, f"{name}: a module that is not in LAYERS; give it a layer"
    return best


def test_every_module_has_a_layer() -> None:
    for name in MODULES:
        if name not in FACADES:
            layer_of(name)


def test_no_upward_import() -> None:
    upward = [
        f"{name} ({LAYERS[layer_of(name)][0]}) imports {dep} ({LAYERS[layer_of(dep)][0]})"
        for name, deps in GRAPH.items() if name not in FACADES
        for dep in sorted(deps) if dep not in FACADES and layer_of(dep) > layer_of(name)
    ]
    assert not upward, "imports against the layer rule (docs/ARCHITECTURE.md):\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each a cycle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle() -> None:
    graph = {n: {d for d in deps if d not in FACADES} for n, deps in GRAPH.items() if n not in FACADES}
    assert _cycles(graph) == []


def test_the_checker_sees_cycles_and_upward_imports() -> None:
    """The two rules above must be able to fail."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer_of("hf_optbench.cli.report") > layer_of("hf_optbench.report.build") > layer_of("hf_optbench.run.train")
    assert layer_of("hf_optbench.run.train") > layer_of("hf_optbench.measure.metrics") > layer_of("hf_optbench.errors")
    lazy = ast.parse("def f():\n    from hf_optbench.report import build\n").body[0].body[0]
    assert _resolve("hf_optbench.run.train", lazy) == {"hf_optbench.report.build"}
    relative = ast.parse("from ..errors import OptBenchError").body[0]
    assert _resolve("hf_optbench.optim.registry", relative) == {"hf_optbench.errors"}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_and_function_sizes(name: str) -> None:
    source = MODULES[name].read_text(encoding="utf-8")
    lines = source.count("\n")
    assert all(key.split(":")[0] in MODULES for key in SIZE_EXCEPTIONS), "an exception for a module that is gone"
    if name not in SIZE_EXCEPTIONS:
        assert lines <= MAX_MODULE_LINES, f"{name}: {lines} lines; split it or add a reason to SIZE_EXCEPTIONS"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES and f"{name}:{node.name}" not in SIZE_EXCEPTIONS
    ]
    assert not long, f"{name}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_reference_to_documents_outside_the_repository() -> None:
    """Research notes and a machine-facts page that live outside the repository cannot be opened by a reader."""
    root = PKG.parent
    files = [*PKG.rglob("*.py"), *(root / "tests").rglob("*.py"), *(root / "benchmarks").rglob("*.py"),
             *(root / "recipes").rglob("*.yaml"), *(root / "docs").rglob("*.md"), root / "README.md",
             *(root / "accelerate_configs").rglob("*")]
    pattern = ("seed 00", "Seed 00", "seed00", "STACK-FACTS", "seeds/")
    me = Path(__file__).resolve()
    hits = [f"{f.relative_to(root)}: {needle}" for f in files if f.is_file() and f.resolve() != me
            for needle in pattern if needle in f.read_text(encoding="utf-8", errors="replace")]
    assert not hits, "\n".join(hits)


def _defined_names(name: str) -> set[str]:
    """Names a module defines itself at module level (def, class, assignment), not the ones it imports."""
    out: set[str] = set()
    for top in ast.parse(MODULES[name].read_text(encoding="utf-8")).body:
        for node in ast.walk(top) if isinstance(top, ast.If | ast.Try) else [top]:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                out.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


def test_every_name_is_imported_from_the_module_that_defines_it() -> None:
    """One place per name: no re-exports inside the package (the public API is hf_optbench/__init__.py only), so
    ``from hf_optbench.X import name`` (package, tests, benchmarks) must name the module where ``name`` is defined."""
    root = PKG.parent
    defined = {name: _defined_names(name) for name in MODULES}
    files = [*PKG.rglob("*.py"), *(root / "tests").rglob("*.py"), *(root / "benchmarks").rglob("*.py")]
    wrong = [
        f"{f.relative_to(root)}:{node.lineno}: {alias.name} is not defined in {node.module}"
        for f in files if "resources" not in f.parts
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and not node.level and node.module in MODULES
        and node.module not in FACADES
        for alias in node.names
        if alias.name not in defined[node.module] and f"{node.module}.{alias.name}" not in MODULES
    ]
    assert not wrong, "\n".join(wrong)


def test_no_module_but_the_facade_declares_all() -> None:
    """``__all__`` outside hf_optbench/__init__.py was how re-exports were kept alive; the facade is the one list."""
    declaring = [name for name in MODULES if name not in FACADES and "__all__" in _defined_names(name)]
    assert not declaring, declaring


def test_the_facade_names_only_what_its_modules_define() -> None:
    import hf_optbench

    wrong = [f"{n} -> {m}" for n, m in hf_optbench._EXPORTS.items() if n not in _defined_names(f"hf_optbench.{m}")]
    assert not wrong, wrong
