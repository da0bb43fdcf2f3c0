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
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch


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
        muon_cls = getattr(torch.optim, "Muon", None)
        if muon_cls is None:  # pragma: no cover - torch < 2.9
            raise RuntimeError("torch.optim.Muon needs torch >= 2.9; use pytorch_optimizer.Muon instead")
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
        self.muon = muon_cls(muon_groups, **muon_kwargs)
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
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
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
