"""Muon for GPT-2's hidden matrices, AdamW for everything else, as one ``torch.optim.Optimizer``.

Muon (Jordan et al. 2024, https://kellerjordan.github.io/posts/muon/; README of KellerJordan/Muon) is meant for
the hidden 2-D weights only: "embeddings, classifier heads, and hidden gains/biases should be optimized using
standard AdamW". ``torch.optim.Muon`` (torch >= 2.9) refuses anything that is not 2-D and has no auxiliary AdamW,
while ``transformers.Trainer`` and Accelerate take exactly one optimizer object. :class:`MuonWithAuxAdamW` is that
object: it owns a ``torch.optim.Muon`` and a ``torch.optim.AdamW`` and exposes their param groups (the same dicts,
so a LR scheduler acting on ours drives both), their state (read-only merged view) and torch's standard
``{"state": ..., "param_groups": ...}`` state dict over those groups, which
``torch.distributed.checkpoint.state_dict`` (FSDP checkpoints) and Trainer's resume both read.
Why written here: neither torch nor Accelerate ships a composite optimizer; pytorch-optimizer's ``Muon`` has a
built-in AdamW but is a reimplementation, and the benchmark uses the library implementation, ``torch.optim.Muon``,
where torch has it (that package's class is the fallback on older torch).

GPT-2 stores its projections as ``transformers.Conv1D`` with weight shape (in, out), the transpose of nn.Linear's
(out, in). Muon's orthogonalisation does not care (orth(G^T) = orth(G)^T), but the shape-based LR factor of
``adjust_lr_fn="original"`` (sqrt(max(1, rows/cols))) does: for c_fc it gives 1 instead of nn.Linear's 2. The
default here is ``adjust_lr_fn="match_rms_adamw"`` (0.2 * sqrt(max(rows, cols)); Liu et al. 2025, "Muon is
Scalable for LLM Training", arXiv:2502.16982, Sec. 2.2), which is symmetric in the shape, so the transposition is
harmless, and which matches the update RMS to AdamW's so Muon can use AdamW's learning rate and weight decay.

The registry entry (cited defaults, builder, memory-planner layout) is ``hf_optbench/optim/muon.py``; which tensors
are hidden matrices is ``hf_optbench.optim.adamw.split_matrix_params``'s rule (shared with AdamW's non-matrix
group).

Newton-Schulz precision (:class:`MuonNS`): ``torch.optim.Muon`` casts the update to bf16 before its Newton-Schulz
iteration, as the reference implementation does (KellerJordan/Muon muon.py@f90a42b, ``zeropower_via_newtonschulz5``:
``G.bfloat16()``). Where bf16 matmuls are native (CUDA, a CPU with AMX or AVX-512-BF16) that is the fast choice;
elsewhere torch emulates the format (1.3-2.5 GFLOP/s against 31-63 in fp32 on an AVX2 CPU, a Muon step 51
ms against 6.9 ms) and fp32 is both faster and closer to exact. ``MuonNS`` runs torch's update with the iteration in
either, batched over same-shape matrices (:func:`muon_batched`); ``optim.muon.resolve_ns_precision`` picks one.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.optim._muon import _adjust_lr
from torch.optim.optimizer import _to_scalar

# ns_precision -> the dtype Newton-Schulz runs in ("bf16": torch's own code path, untouched).
NS_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


class _MergedState(Mapping):
    """Read-only view of several optimizers' ``state`` dicts, as ``optimizer.state`` readers expect."""

    def __init__(self, *states: Mapping) -> None:
        self._states = states

    def __getitem__(self, key: Any) -> Any:
        for state in self._states:
            if key in state:
                return state[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator:
        for state in self._states:
            yield from state

    def __len__(self) -> int:
        return sum(len(s) for s in self._states)


def newton_schulz(grad: torch.Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float,
                  dtype: torch.dtype) -> torch.Tensor:
    """torch's ``_zeropower_via_newtonschulz`` (torch/optim/_muon.py, torch 2.13) with its ``grad.bfloat16()`` made
    a copy in ``dtype``: the same checks, the same quintic iteration, the same transposition of a tall matrix. A
    copy always (``.to(copy=True)``): without ``nesterov`` the update is the momentum buffer itself, which the
    in-place normalisation must not touch."""
    if ns_steps >= 100:
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    if len(grad.shape) != 2:
        raise ValueError("Input tensor gradient must be a 2D matrix")
    if len(ns_coefficients) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")
    a, b, c = ns_coefficients
    ortho = grad.to(dtype, copy=True)
    tall = grad.size(0) > grad.size(1)
    if tall:
        ortho = ortho.T
    ortho.div_(ortho.norm().clamp(min=eps))  # spectral norm at most 1
    for _ in range(ns_steps):
        gram = ortho @ ortho.T
        update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        ortho = torch.addmm(ortho, update, ortho, beta=a)
    return ortho.T if tall else ortho


def muon_per_matrix(dtype: torch.dtype, params: list[torch.Tensor], grads: list[torch.Tensor],
                    bufs: list[torch.Tensor], group: Mapping[str, Any]) -> None:
    """torch's ``_single_tensor_muon`` (torch/optim/_muon.py, torch 2.13) for one group, line for line, with
    :func:`newton_schulz` in ``dtype``: momentum, Nesterov, decoupled weight decay and the shape's LR factor are
    torch's arithmetic (``_adjust_lr`` is torch's own). One matrix at a time: the reference that
    :func:`muon_batched` is tested against (tests/optim/test_muon.py); the optimizer steps through the batched one."""
    lr = _to_scalar(group["lr"])
    momentum = group["momentum"]
    for param, grad, buf in zip(params, grads, bufs, strict=True):
        if grad.ndim != 2:
            raise ValueError("Param gradient must be a 2D matrix")
        buf.lerp_(grad, 1 - momentum)
        update = grad.lerp(buf, momentum) if group["nesterov"] else buf
        update = newton_schulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"], dtype)
        adjusted_lr = _adjust_lr(lr, group["adjust_lr_fn"], param.shape)
        param.mul_(1 - lr * group["weight_decay"])
        param.add_(update, alpha=-adjusted_lr)


def newton_schulz_batched(stack: torch.Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int,
                          eps: float) -> torch.Tensor:
    """:func:`newton_schulz` on a stack (B, m, n), m <= n, of B matrices at once: each matrix normalised by its own
    Frobenius norm, then the same quintic iteration with batched matmuls (``torch.baddbmm``), so each matrix gets
    the arithmetic it gets alone, in B times fewer calls. ``stack`` must be a fresh tensor in the working dtype (it
    is normalised in place)."""
    if ns_steps >= 100:
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    if len(ns_coefficients) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")
    a, b, c = ns_coefficients
    ortho = stack
    ortho.div_(torch.linalg.vector_norm(ortho, dim=(-2, -1), keepdim=True).clamp(min=eps))  # spectral norms <= 1
    for _ in range(ns_steps):
        gram = torch.bmm(ortho, ortho.mT)
        update = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        ortho = torch.baddbmm(ortho, update, ortho, beta=a)
    return ortho


# An fp32 stack is orthogonalised in chunks of at most this many bytes, a bf16 one whole. Measured on this
# project's AMD EPYC (Zen 4, 1 MiB L2 per core), one thread, CPU time, median of 9: 8 fp32 matrices of 128 x 512
# took 21.2 ms in chunks of one against 28.6-31.7 ms stacked whole (a stack past L2 streams through memory once per
# matmul), 4 of 64 x 256 1.40 ms whole against 1.89 ms one by one, 12 of 192 x 768 110 ms in chunks of one against
# 126 ms whole; in bf16 (oneDNN's batched kernel) the whole stack was the fastest at every one of those shapes.
FP32_CHUNK_BYTES = 256 * 1024


def _stacks(updates: list[torch.Tensor], dtype: torch.dtype) -> list[list[int]]:
    """The updates' indices grouped into the stacks Newton-Schulz runs on: by the shape it sees (a tall matrix
    transposed, so GPT-2's c_fc (d, 4d) and its MLP c_proj (4d, d) share one stack), dtype and device, in first-seen
    order; an fp32 stack cut into chunks of :data:`FP32_CHUNK_BYTES`."""
    buckets: dict[tuple[Any, ...], list[int]] = {}
    for i, u in enumerate(updates):
        rows, cols = u.shape
        buckets.setdefault((min(rows, cols), max(rows, cols), u.dtype, u.device), []).append(i)
    out = []
    for (m, n, _, _), idx in buckets.items():
        size = max(1, FP32_CHUNK_BYTES // (m * n * 4)) if dtype == torch.float32 else len(idx)
        out += [idx[k:k + size] for k in range(0, len(idx), size)]
    return out


def orthogonalise(updates: list[torch.Tensor], dtype: torch.dtype, ns_coefficients: tuple[float, float, float],
                  ns_steps: int, eps: float) -> list[torch.Tensor]:
    """Each update's Newton-Schulz result (in ``dtype``, in the update's own orientation), computed over the stacks
    of :func:`_stacks`; the updates themselves are not touched (each stack is a fresh copy). A stack of one matrix
    (an fp32 chunk of one) runs :func:`newton_schulz` on it: the same arithmetic without the stacking copy, which for
    a tall matrix is a strided transposing copy. It does not close the whole gap: at mini in fp32 under AVX2
    (benchmarks/results/muon_step.md) the batched optimizer step is still about 7 % slower than one matrix at a
    time, a difference this rule leaves unexplained."""
    out: list[torch.Tensor] = list(updates)
    for idx in _stacks(updates, dtype):
        if len(idx) == 1:
            out[idx[0]] = newton_schulz(updates[idx[0]], ns_coefficients, ns_steps, eps, dtype)
            continue
        tall = [updates[i].size(0) > updates[i].size(1) for i in idx]
        stack = torch.stack([updates[i].mT if t else updates[i] for i, t in zip(idx, tall, strict=True)])
        stack = stack.to(dtype) if stack.dtype != dtype else stack
        ortho = newton_schulz_batched(stack, ns_coefficients, ns_steps, eps)
        for k, (i, t) in enumerate(zip(idx, tall, strict=True)):
            out[i] = ortho[k].mT if t else ortho[k]
    return out


def muon_batched(dtype: torch.dtype, params: list[torch.Tensor], grads: list[torch.Tensor], bufs: list[torch.Tensor],
                 group: Mapping[str, Any]) -> None:
    """:func:`muon_per_matrix`'s update with the matrices of one (oriented) shape orthogonalised together: the
    momentum and Nesterov blend as torch's foreach ops over the group, then per shape stacked copies in ``dtype``
    through :func:`newton_schulz_batched` (:func:`orthogonalise`), then weight decay and the step with each matrix's
    own LR factor. Per matrix the arithmetic is :func:`muon_per_matrix`'s (tested to float tolerance, tests/optim/test_muon.py).

    Why: torch's Muon runs Newton-Schulz one matrix at a time (3 matmuls x ns_steps per matrix, each a separate
    call); at the CPU study's sizes (matrices of 64-512 rows) the calls cost as much as the arithmetic: one bf16
    pass over tiny's 8 matrices took 3.7-4.2 ms one at a time and 2.1-2.5 ms stacked (this project's AMD EPYC, one
    thread, CPU time; the optimizer steps in benchmarks/results/study_step.md). Stacking same-shape parameters and
    orthogonalising them with batched matmuls is what modded-nanogpt does (KellerJordan/modded-nanogpt train_gpt.py@0016a3c45a41748e729b097a9db15e9840328b52,
    ``polar_express``: a chunk of stacked same-shape matrices, normalised over dims (-2, -1), iterated with
    ``baddbmm``); the iteration here stays torch's quintic Newton-Schulz with torch's coefficients."""
    for grad in grads:
        if grad.ndim != 2:
            raise ValueError("Param gradient must be a 2D matrix")
    if not params:
        return
    lr = _to_scalar(group["lr"])
    momentum = group["momentum"]
    torch._foreach_lerp_(bufs, grads, 1 - momentum)
    updates = torch._foreach_lerp(grads, bufs, momentum) if group["nesterov"] else bufs
    orthos = orthogonalise(updates, dtype, group["ns_coefficients"], group["ns_steps"], group["eps"])
    torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
    for i, param in enumerate(params):
        param.add_(orthos[i], alpha=-_adjust_lr(lr, group["adjust_lr_fn"], param.shape))


def _closure_loss(closure: Any) -> Any:
    """The loss of an optimizer step's closure, evaluated with gradients on (torch's ``step`` protocol)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class MuonNS(torch.optim.Muon):
    """``torch.optim.Muon`` with its Newton-Schulz iteration in ``ns_precision`` ("bf16" or "fp32"), held in every
    param group (so the run's plan checks it, trackers read it and checkpoints carry it), and the matrices of one
    shape orthogonalised together (:func:`muon_batched`).

    Every group steps through :func:`muon_batched`: torch's update (momentum, Nesterov, decoupled weight decay,
    ``_adjust_lr``), with the iteration in bf16 (torch's own cast: ``grad.bfloat16()``) or fp32, batched over
    same-shape matrices. Per matrix that is torch.optim.Muon's arithmetic up to the rounding of a batched matmul
    against a single one (tests/optim/test_muon.py: against torch.optim.Muon and the per-matrix path). The state is
    torch's (``momentum_buffer`` per matrix, created by torch's ``_init_group``), so checkpoints, resume and the
    memory planner hold as before, and a checkpoint of torch.optim.Muon loads here and back.
    Why hand-written: torch hard-codes ``grad.bfloat16()`` and one matrix at a time in module-level functions
    (torch/optim/_muon.py, torch 2.13: ``foreach`` "is not supported for Muon yet") and takes no precision argument;
    replacing them would change every Muon in the process (a global monkeypatch).
    """

    def __init__(self, params: Any, *, ns_precision: str = "bf16", **kwargs: Any) -> None:
        if ns_precision not in NS_DTYPES:
            raise ValueError(f"ns_precision must be one of {sorted(NS_DTYPES)}, got {ns_precision!r}")
        super().__init__(params, **kwargs)
        self.defaults["ns_precision"] = ns_precision
        for group in self.param_groups:
            group.setdefault("ns_precision", ns_precision)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = _closure_loss(closure)
        for group in self.param_groups:
            params: list[torch.Tensor] = []
            grads: list[torch.Tensor] = []
            bufs: list[torch.Tensor] = []
            self._init_group(group, params, grads, bufs)
            precision = group.get("ns_precision", self.defaults["ns_precision"])
            muon_batched(NS_DTYPES[precision], params, grads, bufs, group)
        return loss


class MuonWithAuxAdamW(torch.optim.Optimizer):
    """``torch.optim.Muon`` on ``muon_groups`` + ``torch.optim.AdamW`` on ``adamw_groups``, stepped together.

    ``param_groups`` lists Muon's groups first, then AdamW's; each group dict carries ``use_muon``. Schedulers,
    gradient clipping, Accelerate and Trainer checkpoints work on it as on any optimizer.
    """

    def __init__(
        self,
        muon_groups: list[dict[str, Any]],
        adamw_groups: list[dict[str, Any]],
        *,
        muon_kwargs: dict[str, Any],
        adamw_kwargs: dict[str, Any],
    ) -> None:
        muon_groups = [dict(g, use_muon=True) for g in muon_groups if g["params"]]
        adamw_groups = [dict(g, use_muon=False) for g in adamw_groups if g["params"]]
        if not muon_groups:
            raise ValueError("MuonWithAuxAdamW: the model has no hidden 2-D matrices for Muon")
        if muon_kwargs.get("adjust_lr_fn") in (None, "original"):
            warnings.warn(
                "Muon with adjust_lr_fn='original' scales the LR by sqrt(max(1, rows/cols)) of the stored shape; "
                "GPT-2's Conv1D weights are stored transposed (in, out), so the factor differs from nn.Linear's. "
                "adjust_lr_fn='match_rms_adamw' is symmetric in the shape.",
                stacklevel=2,
            )
        self.muon = MuonNS(muon_groups, **muon_kwargs)
        self.adamw = torch.optim.AdamW(adamw_groups, **adamw_kwargs) if adamw_groups else None
        children = [o for o in (self.muon, self.adamw) if o is not None]
        # Optimizer.__init__ sets up hooks and profiling names; its own param groups are then replaced by the
        # children's dicts so that whatever changes a group (LR scheduler, find-lr) changes the child's.
        super().__init__([p for o in children for g in o.param_groups for p in g["params"]], {})
        self.param_groups = [g for o in children for g in o.param_groups]
        self.state = _MergedState(*(o.state for o in children))  # type: ignore[assignment]
        self._children = children

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = _closure_loss(closure)
        for opt in self._children:
            opt.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self._children:
            opt.zero_grad(set_to_none=set_to_none)

    # state_dict() is torch.optim.Optimizer's own: it packs self.param_groups (Muon's groups, then AdamW's) and
    # the merged self.state into the standard layout, parameters numbered in that order.

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        """Load the standard layout by handing each child its groups and their parameters' state (torch's own
        load_state_dict would replace our group dicts and unlink them from the children's); the nested
        ``{"muon": ..., "adamw": ...}`` layout of earlier hf_optbench checkpoints is still read."""
        if set(state_dict) == {"muon", "adamw"}:
            parts = [state_dict["muon"], state_dict["adamw"]][: len(self._children)]
        elif set(state_dict) == {"state", "param_groups"}:
            groups, state = state_dict["param_groups"], state_dict["state"]
            if len(groups) != len(self.param_groups):
                raise ValueError(f"state dict has {len(groups)} param groups, this optimizer {len(self.param_groups)}")
            parts, start = [], 0
            for child in self._children:
                mine = groups[start:start + len(child.param_groups)]
                start += len(mine)
                ids = [i for g in mine for i in g["params"]]
                parts.append({"state": {i: state[i] for i in ids if i in state}, "param_groups": mine})
        else:
            raise ValueError("not a MuonWithAuxAdamW state dict (expected 'state' and 'param_groups')")
        for child, part in zip(self._children, parts, strict=True):
            child.load_state_dict(part)
        # torch's load_state_dict replaces the children's group dicts and state dicts: point ours at the new ones
        self.param_groups = [g for o in self._children for g in o.param_groups]
        self.state = _MergedState(*(o.state for o in self._children))  # type: ignore[assignment]
