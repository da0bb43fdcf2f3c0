"""What one optimizer family module declares: :class:`OptimizerSpec` (one registry row) and :class:`StateLayout`
(its optimizer state, for the memory planner).

Why a module of its own: the family modules (``optim/adamw.py``, ``optim/lion.py``, ...) build their specs from
these classes and ``optim/registry.py`` imports the family modules; keeping the classes here avoids an import
cycle. Standard library only: ``hf-optbench --help`` / ``validate`` read the registry without importing torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

# keys of optimizer_defaults() that are training arguments, not constructor arguments
TRAINING_KEYS = ("learning_rate", "weight_decay", "max_grad_norm")


class TensorShape(Protocol):
    """One trainable tensor as the planner describes it (``measure.planner.ParamShape``)."""

    shape: tuple[int, ...]
    is_embedding: bool
    is_hidden_matrix: bool

    @property
    def numel(self) -> int: ...


# (tensors, element size of torch-held state in bytes, embedding_state_32bit) -> bytes of optimizer state
StateFormula = Callable[[Sequence[TensorShape], int, bool], int]


@dataclass(frozen=True)
class StateLayout:
    """The optimizer state an implementation keeps, as bytes over the model's tensors (unpartitioned).

    ``name`` appears in the planner's notes; ``per_tensor`` marks layouts whose size depends on each tensor's
    shape or role (8-bit blocks and fp32 embeddings, factored moments, Muon's split), so they change when ZeRO
    flattens the parameters (the planner then applies ``state_bytes`` to the flat partitions).
    """

    name: str
    state_bytes: StateFormula
    per_tensor: bool = False


def per_tensor(fn: Callable[[TensorShape, int], int]) -> StateFormula:
    """A :data:`StateFormula` summing ``fn(tensor, element_size)`` over the tensors (most layouts)."""

    def total(shapes: Sequence[TensorShape], s: int, embedding_state_32bit: bool) -> int:
        return sum(fn(p, s) for p in shapes)

    return total


@dataclass(frozen=True)
class CitedDefaults:
    """An optimizer's cited hyperparameters at one size class, each traceable to a citation (a ``CITATIONS`` key of
    its family module): ``own_keys`` to ``own`` (the family's source), the rest to ``cite`` (the base it derives
    from, e.g. GPT-3 for AdamW's values), and ``also`` on every key (e.g. the 8-bit paper)."""

    values: dict[str, Any]
    cite: str
    own: str | None = None
    own_keys: tuple[str, ...] = ()
    also: str | None = None

    def derive(self, own: str, *, drop: tuple[str, ...] = (), base_values: dict[str, Any] | None = None,
               **own_values: Any) -> CitedDefaults:
        """A family's defaults on this base: ``drop`` keys removed, ``base_values`` (renamed base values) still
        cited to the base, ``own_values`` set and cited to ``own``."""
        values = {k: v for k, v in self.values.items() if k not in drop}
        values.update(base_values or {}, **own_values)
        return CitedDefaults(values, self.cite, own, tuple(own_values), self.also)


# Builder signature: (model, param groups, lr, constructor kwargs, *, spec, weight_decay, embedding_state_32bit)
# -> (optimizer, implementation string for summary.json). Keyword arguments a builder does not use go to **_.
Builder = Callable[..., "tuple[torch.optim.Optimizer, str]"]

# The roles a trainable tensor of a GPT-2 plays, which decide its parameter group: a hidden 2-D matrix (attention and
# MLP projections), an embedding (token and position embeddings, the tied output head), or a vector (biases and
# LayerNorm gains). GPT-3 / nanoGPT decay the first two and not the third; Muon takes only the first.
MATRIX, EMBEDDING, VECTOR = "matrix", "embedding", "vector"


@dataclass(frozen=True)
class GroupLayout:
    """One parameter group a family's builder creates: the tensor roles it holds, whether it takes the run's weight
    decay (else 0.0), and the constructor arguments that set its rate and decay instead of ``learning_rate`` /
    ``weight_decay`` (Muon's ``muon_lr`` for the matrices), or that scales ``learning_rate`` for it
    (``nonmatrix_lr_ratio``, the non-matrix group's tuned rate: adamw, muon). The run's plan reads a family's
    layouts to state each group's learning rate and weight decay with their sources before anything is built, and
    checks the built
    optimizer's ``param_groups`` against them (``hf_optbench.run.plan``). A family that gives a group its own rate
    declares the constructor argument here and sets the group's ``lr`` from it in its builder."""

    name: str
    roles: tuple[str, ...]
    decay: bool = True
    lr_kwarg: str | None = None
    wd_kwarg: str | None = None
    lr_ratio_kwarg: str | None = None  # the group's rate is this constructor argument x learning_rate (adamw, muon)


# GPT-3 / nanoGPT groups (:func:`param_groups`): decay on matrices and embeddings, none on vectors.
GPT3_GROUPS = (GroupLayout("decay", (MATRIX, EMBEDDING)), GroupLayout("no_decay", (VECTOR,), decay=False))
# One group of every tensor at the class's own decay (a dotted-path class that takes no weight_decay).
SINGLE_GROUP = (GroupLayout("all", (MATRIX, EMBEDDING, VECTOR), decay=False),)


@dataclass(frozen=True)
class OptimizerSpec:
    """One registry entry, declared by its family module.

    ``kwargs`` lists the extra constructor arguments accepted (checked without importing the library; tests check
    each against the library's signature). ``defaults(size_class)`` gives the cited values
    (:class:`CitedDefaults`).
    ``builder`` constructs it (torch imported inside). ``layout`` is its state for the memory planner.
    ``callbacks`` (a factory, called per Trainer) returns the TrainerCallbacks it needs. ``aliases`` are other
    names that resolve to it. ``zero_incompatible`` says why it cannot run on DeepSpeed ZeRO's flat 1-D
    partitions ("" = it can). ``describe(optimizer, built, flattened, *, embedding_ids)`` rewrites the
    implementation string from the state the optimizer really holds (None: the built string, marked when ZeRO
    flattened the parameters). ``groups``: the parameter groups its builder makes (:class:`GroupLayout`).
    ``tune_weight_decay``: its cited weight decay differs from AdamW's (the Lion paper moves it 3-10x with the
    learning rate, Chen et al. 2023 Sec. 5), so a sweep's ``tune:`` phase tunes it too, after the learning rate
    (``study.tuning``); an optimizer whose cited weight decay is AdamW's keeps it.
    """

    name: str
    implementation: str
    builder: Builder
    defaults: Callable[[str], CitedDefaults]
    kwargs: tuple[str, ...]
    description: str
    layout: StateLayout
    package: str = "torch"
    requires_cuda: bool = False
    schedule_free: bool = False
    needs_tuning: bool = False
    rejected_kwargs: dict[str, str] = field(default_factory=dict)
    callbacks: Callable[[], list[Any]] | None = None
    aliases: tuple[str, ...] = ()
    zero_incompatible: str = ""
    describe: Callable[[Any, str, bool], str] | None = None
    tune_weight_decay: bool = False
    manual_step: Callable[..., None] | None = None
    # the layouts, or a function of the constructor values giving them (AdamW splits its non-matrix parameters
    # into groups of their own only where their rate differs: optim.adamw.groups)
    groups: tuple[GroupLayout, ...] | Callable[[Mapping[str, Any]], tuple[GroupLayout, ...]] = GPT3_GROUPS
    # constructor values an "auto" resolves over the model (Muon's ns_precision): (model, ctor) -> {key: (value,
    # why)}; the Python API's build records why, as a run's plan does (registry.build_optimizer)
    resolve_auto: Callable[[Any, Mapping[str, Any]], dict[str, tuple[Any, str]]] | None = None

    def group_layouts(self, constructor: Mapping[str, Any]) -> tuple[GroupLayout, ...]:
        """The parameter groups the builder makes with these constructor values."""
        return self.groups(constructor) if callable(self.groups) else self.groups


def with_note(impl: str, note: str) -> str:
    """``impl`` with ``note`` added inside its closing parenthesis ("X(fused=True)" -> "X(fused=True, note)"), or in
    new ones ("X" -> "X(note)"): implementation strings read the same whether a builder or the object gave them."""
    return f"{impl[:-1]}, {note})" if impl.endswith(")") else f"{impl}({note})"


def round3(x: float) -> float:
    """Three significant digits: a derived default reads 2e-4, not 1.9999999999999998e-4."""
    return float(f"{x:.3g}")


def trainable_params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimizer gets (``requires_grad``), tied weights once."""
    return [p for p in model.parameters() if p.requires_grad]


def tensor_roles(model: torch.nn.Module) -> dict[int, str]:
    """{id(parameter): role} of ``model``'s trainable tensors (:data:`MATRIX`, :data:`EMBEDDING`, :data:`VECTOR`):
    the weights of ``nn.Embedding`` modules and the output embedding are embeddings (tied or not, as the Muon README
    counts them), other tensors of >= 2 dims matrices, the rest vectors."""
    import torch

    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    get_out = getattr(model, "get_output_embeddings", None)
    out = get_out() if callable(get_out) else None
    if out is not None and getattr(out, "weight", None) is not None:
        embeddings.add(id(out.weight))
    return {id(p): EMBEDDING if id(p) in embeddings else MATRIX if p.dim() >= 2 else VECTOR
            for p in trainable_params(model)}


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """GPT-3 / nanoGPT groups: weight decay on tensors with >= 2 dims (matmul weights, embeddings), none on biases,
    LayerNorm gains and other 1-D tensors. Tied weights appear once. Empty groups are left out."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():  # remove_duplicate=True: the tied wte/lm_head weight once
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": float(weight_decay)}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]
