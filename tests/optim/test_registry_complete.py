"""Every registered optimizer is complete: a row in the test matrix below, cited defaults for every size class, a
state layout for the memory planner, and constructor arguments its library accepts. Every model size has a size
class those defaults exist for. Adding an optimizer without its matrix row fails here, loudly."""

from __future__ import annotations

import importlib

import pytest

from hf_optbench.measure.planner import gpt2_param_shapes, planned_optimizer_state_bytes, state_layout
from hf_optbench.models import GPT2_SIZES, SIZE_CLASS
from hf_optbench.optim.registry import CITATIONS, OPTIMIZERS, SIZE_CLASSES, optimizer_defaults
from hf_optbench.optim.spec import StateLayout

# The optimizer test matrix: registry name -> (the class its `kwargs` are passed to, by dotted path; the kwargs
# the builder consumes itself; "cpu" or "cuda", where it can step). One row per registry optimizer.
MATRIX: tuple[tuple[str, str, frozenset[str], str], ...] = (
    ("adamw", "torch.optim.AdamW", frozenset({"nonmatrix_lr_ratio"}), "cpu"),
    ("lion", "lion_pytorch.Lion", frozenset(), "cpu"),
    ("lion_foreach", "lion_pytorch.foreach.Lion", frozenset(), "cpu"),
    ("adamw_8bit", "bitsandbytes.optim.AdamW8bit", frozenset(), "cpu"),
    ("paged_adamw_8bit", "bitsandbytes.optim.PagedAdamW8bit", frozenset(), "cuda"),
    ("lion_8bit", "bitsandbytes.optim.Lion8bit", frozenset(), "cpu"),
    ("paged_lion_8bit", "bitsandbytes.optim.PagedLion8bit", frozenset(), "cuda"),
    ("lion_32bit", "bitsandbytes.optim.Lion32bit", frozenset(), "cpu"),
    ("adafactor", "transformers.optimization.Adafactor", frozenset(), "cpu"),
    ("sgd", "torch.optim.SGD", frozenset(), "cpu"),
    ("schedule_free_adamw", "schedulefree.AdamWScheduleFree", frozenset(), "cpu"),
    ("muon", "torch.optim.Muon", frozenset({"muon_lr", "adamw_betas", "adamw_eps", "nonmatrix_lr_ratio", "ns_precision"}),
     "cpu"),
    ("sophia", "hf_optbench.optim.sophia_impl.SophiaG", frozenset(), "cpu"),
    ("soap", "pytorch_optimizer.SOAP", frozenset(), "cpu"),
)
ROWS = {row[0]: row for row in MATRIX}


def _import(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_the_matrix_has_one_row_per_registered_optimizer() -> None:
    names = [row[0] for row in MATRIX]
    assert len(names) == len(set(names)), "duplicate rows in MATRIX"
    assert set(names) == set(OPTIMIZERS), (
        f"add a MATRIX row for {sorted(set(OPTIMIZERS) - set(names))}; drop the rows for "
        f"{sorted(set(names) - set(OPTIMIZERS))}")


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_defaults_for_every_size_class_with_a_citation_per_key(name: str) -> None:
    cited = set(CITATIONS.values())
    for size_class in SIZE_CLASSES:
        d = optimizer_defaults(name, size_class)
        values = {k for k in d if k not in ("sources", "source", "size_class")}
        assert values == set(d["sources"]), (name, size_class, values ^ set(d["sources"]))
        for key, source in d["sources"].items():
            assert source and all(part in cited for part in source.split(" | ")), (name, size_class, key)
        assert d["learning_rate"] > 0 and d["weight_decay"] >= 0


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_planner_layout(name: str) -> None:
    spec = OPTIMIZERS[name]
    assert isinstance(spec.layout, StateLayout) and state_layout(name) is spec.layout
    shapes = gpt2_param_shapes("tiny", 50_304, 64)
    assert planned_optimizer_state_bytes(name, shapes) > 0
    assert planned_optimizer_state_bytes(name, shapes, state_bytes=2) <= planned_optimizer_state_bytes(name, shapes)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_kwargs_fit_the_library_class_and_the_device_column(name: str) -> None:
    """The allow-lists let config validate without importing torch; they must not promise what the library does
    not take."""
    import inspect

    _, path, own, device = ROWS[name]
    spec = OPTIMIZERS[name]
    accepted = set(inspect.signature(_import(path).__init__).parameters)
    assert set(spec.kwargs) - own <= accepted, (name, set(spec.kwargs) - own - accepted)
    assert own <= set(spec.kwargs)
    assert spec.requires_cuda == (device == "cuda")


def test_every_model_size_has_a_size_class_with_defaults() -> None:
    assert set(SIZE_CLASS) == set(GPT2_SIZES)
    assert set(SIZE_CLASS.values()) <= set(SIZE_CLASSES)
    for size in GPT2_SIZES:
        assert optimizer_defaults("adamw", size)["size_class"] == SIZE_CLASS[size]


def test_citation_keys_and_aliases_are_unique_across_families() -> None:
    """The registry refuses clashes at import; this pins that every family contributes what it declares."""
    from hf_optbench.optim.registry import ALIASES, FAMILIES

    assert sum(len(f.CITATIONS) for f in FAMILIES) == len(CITATIONS)
    assert sum(len(s.aliases) for f in FAMILIES for s in f.SPECS) == len(ALIASES)
    assert not set(ALIASES) & set(OPTIMIZERS)
