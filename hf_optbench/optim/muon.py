"""Muon (Jordan et al. 2024; KellerJordan/Muon) on GPT-2's hidden matrices with an auxiliary AdamW for the rest.

The composite optimizer, :class:`MuonWithAuxAdamW`, lives in ``muon_impl`` (it needs torch at import), so that this
module stays standard-library only; which tensors are hidden matrices is ``adamw.split_matrix_params``'s rule.

Two learning rates, two groups: ``learning_rate`` drives the hidden matrices (Muon), ``nonmatrix_lr_ratio`` x
learning_rate the rest (the auxiliary AdamW: embeddings, head, LayerNorm gains, biases). Both are tuned, one after
the other (study.tuning), as Marin's phase I tunes Muon's ``muon_to_adam_lr``; AdamW gets the same freedom.

Newton-Schulz precision, ``ns_precision`` (``auto`` | ``bf16`` | ``fp32``): the reference implementation and
``torch.optim.Muon`` run the iteration in bf16, fast where bf16 matmuls are native and emulated (20-30x slower than
fp32) elsewhere. ``auto`` is resolved once, in the run's plan (``run.plan``), by :func:`resolve_ns_precision`: on a CPU
by timing both on the run's matrices (``optim.muon_precision``: the faster that passes an accuracy check against
fp32, measured once per machine and cached with the data cache), on a GPU from what torch reports of the device
(:func:`bf16_matmul_native`); the plan, summary.json, the card and the trackers record the choice with its reason
(both timings). It changes what is trained (the orthogonalised update differs by ~1 % between the two), so it
is part of the run's identity; ``benchmarks/bench_ns_precision.py`` shows what it changes in the results.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hf_optbench.errors import OptBenchError
from hf_optbench.optim.adamw import (
    NONMATRIX_KEY,
    adamw_base,
    adamw_tensor_bytes,
    fused_ok,
    split_matrix_params,
)
from hf_optbench.optim.muon_precision import bf16_matmul_native, measured_choice
from hf_optbench.optim.spec import (
    EMBEDDING,
    MATRIX,
    VECTOR,
    CitedDefaults,
    GroupLayout,
    OptimizerSpec,
    StateLayout,
    per_tensor,
    trainable_params,
)

if TYPE_CHECKING:
    import torch

CITATIONS: dict[str, str] = {
    "muon": "KellerJordan/Muon README (momentum 0.95, nesterov, ns_steps 5; AdamW for embeddings/head/gains); "
            "Liu et al. 2025, Muon is Scalable for LLM Training, arXiv:2502.16982 Sec. 2.2 (adjust_lr_fn "
            "match_rms_adamw: reuse AdamW's LR and weight decay 0.1, for the AdamW part too: nonmatrix_lr_ratio 1); "
            "Newton-Schulz in bf16 as KellerJordan/Muon muon.py@f90a42b (zeropower_via_newtonschulz5: G.bfloat16()) "
            "and torch/optim/_muon.py run it, where it is the faster here (ns_precision auto: timed on a CPU, bf16 "
            "where native on a GPU)",
}
NS_KEY = "ns_precision"
NS_PRECISIONS = ("auto", "bf16", "fp32")


def check_ns_precision(value: Any) -> str:
    """``value`` if it is one of :data:`NS_PRECISIONS`, else OptBenchError naming the choices."""
    if value not in NS_PRECISIONS:
        raise OptBenchError(f"optimizer_kwargs {NS_KEY} {value!r} is not one of {', '.join(NS_PRECISIONS)}: set "
                            f"e.g. --optimizer_kwargs '{{\"{NS_KEY}\": \"fp32\"}}', or leave it at auto.")
    return str(value)


def resolve_ns_precision(value: Any, device_type: str, shapes: list[tuple[int, int]] | None = None,
                         cache_dir: str | None = None) -> tuple[str, str]:
    """(precision, why) for ``ns_precision`` ``value`` on ``device_type`` ("cpu" | "cuda"): a forced value as it is;
    ``auto`` on a CPU, given the run's matrix ``shapes``, the faster of bf16 and fp32 measured on them that passes the
    accuracy check (``optim.muon_precision``, cached in ``cache_dir``); on a GPU, or without shapes, bf16 where
    :func:`bf16_matmul_native` says so (the reference implementation's precision), else fp32."""
    value = check_ns_precision(value)
    if value != "auto":
        return value, f"set to {value}"
    if device_type == "cpu" and shapes:
        return measured_choice(shapes, cache_dir)
    native, seen = bf16_matmul_native(device_type)
    return ("bf16", f"auto: bf16 matmuls native ({seen})") if native else \
        ("fp32", f"auto: bf16 matmuls not native, so fp32 ({seen})")


def defaults(size_class: str) -> CitedDefaults:
    """AdamW's LR and weight decay (match_rms_adamw makes them transferable), the README's Muon settings."""
    base = adamw_base(size_class)
    adamw = {"adamw_betas": base.values["betas"], "adamw_eps": base.values["eps"]}  # the auxiliary AdamW's
    return base.derive("muon", drop=("betas", "eps"), base_values=adamw, momentum=0.95, nesterov=True, ns_steps=5,
                       adjust_lr_fn="match_rms_adamw", ns_precision="auto", learning_rate=base.values["learning_rate"],
                       weight_decay=base.values["weight_decay"], **{NONMATRIX_KEY: 1.0})


def build(model: torch.nn.Module, groups: list[dict[str, Any]], lr: float, ctor: dict[str, Any],
          **_: Any) -> tuple[Any, str]:
    """MuonWithAuxAdamW: the GPT-3 groups split into Muon's (hidden matrices, at ``muon_lr`` or lr) and AdamW's (the
    rest, at ``nonmatrix_lr_ratio`` x lr)."""
    from hf_optbench.optim.muon_impl import MuonWithAuxAdamW

    muon_lr = ctor.pop("muon_lr", None)
    ratio = float(ctor.pop(NONMATRIX_KEY, 1.0))
    if not 0 < ratio < float("inf"):
        raise OptBenchError(f"{NONMATRIX_KEY} must be a finite number > 0, got {ratio!r}.")
    adamw_betas = ctor.pop("adamw_betas", (0.9, 0.95))
    adamw_eps = ctor.pop("adamw_eps", 1e-8)
    # a run's plan resolved auto already (run.plan), build_optimizer too (resolve_auto); any other caller here
    hidden, _ = split_matrix_params(model)
    precision, _ = _resolve_on(model, ctor.pop(NS_KEY, "auto"))
    if ctor.get("adjust_lr_fn") in (None, "original") and muon_lr is None:
        raise OptBenchError(
            "muon with adjust_lr_fn 'original' takes its LR in spectral units (Keller Jordan's README: 0.02), not "
            "AdamW's: set optimizer_kwargs muon_lr (e.g. 0.02), or keep adjust_lr_fn 'match_rms_adamw'."
        )
    hidden_ids = {id(p) for p in hidden}
    muon_groups, adamw_groups = [], []
    for g in groups:
        mine = [p for p in g["params"] if id(p) in hidden_ids]
        rest = [p for p in g["params"] if id(p) not in hidden_ids]
        if mine:
            muon_groups.append({**g, "params": mine, "lr": muon_lr if muon_lr is not None else lr})
        if rest:
            adamw_groups.append({**g, "params": rest, "lr": lr * ratio})
    adamw_kwargs: dict[str, Any] = {"lr": lr * ratio, "betas": tuple(adamw_betas), "eps": adamw_eps}
    if fused_ok(trainable_params(model)):
        adamw_kwargs["fused"] = True
    opt = MuonWithAuxAdamW(muon_groups, adamw_groups, muon_kwargs={"lr": lr, **ctor, NS_KEY: precision},
                           adamw_kwargs=adamw_kwargs)
    aux = "fused=True" if adamw_kwargs.get("fused") else "foreach"
    # torch.optim.Muon's update with same-shape matrices orthogonalised together, in either precision (MuonNS)
    muon = "hf_optbench.optim.muon_impl.MuonNS[torch.optim.Muon, batched]"
    return opt, (f"{muon}(adjust_lr_fn={ctor.get('adjust_lr_fn')}, Newton-Schulz {precision})+torch.optim.AdamW({aux}) "
                 f"[{len(hidden)} hidden matrices on Muon]")


def muon_tensor_bytes(p: Any, s: int) -> int:
    """torch.optim.Muon's ``momentum_buffer`` for the 2-D hidden matrices, AdamW state (two moments and a step)
    for the embeddings, biases and LayerNorms."""
    return s * p.numel if p.is_hidden_matrix else adamw_tensor_bytes(p, s)


LAYOUT = StateLayout("muon", per_tensor(muon_tensor_bytes), per_tensor=True)
# The groups build() makes: Muon's hidden matrices (at muon_lr when set), then the auxiliary AdamW's embeddings
# (decayed) and vectors (not decayed), both at nonmatrix_lr_ratio x the learning rate.
GROUPS = (GroupLayout("muon", (MATRIX,), lr_kwarg="muon_lr"),
          GroupLayout("adamw_decay", (EMBEDDING,), lr_ratio_kwarg=NONMATRIX_KEY),
          GroupLayout("adamw_no_decay", (VECTOR,), decay=False, lr_ratio_kwarg=NONMATRIX_KEY))

def _resolve_on(model: torch.nn.Module, value: Any) -> tuple[str, str]:
    """:func:`resolve_ns_precision` of ``value`` over ``model``'s hidden matrices, on the device they are on."""
    hidden, _ = split_matrix_params(model)
    return resolve_ns_precision(value, next(iter(trainable_params(model))).device.type,
                                shapes=[tuple(p.shape) for p in hidden])


def resolve_auto(model: Any, ctor: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """``ns_precision`` auto resolved over ``model``, with why (once, before the build): the Python API's record
    gives the reason, as a run's plan does."""
    return {NS_KEY: _resolve_on(model, "auto")} if ctor.get(NS_KEY, "auto") == "auto" else {}


SPECS = (
    OptimizerSpec("muon", "torch.optim.Muon+torch.optim.AdamW", build, defaults,
                  ("momentum", "nesterov", "ns_steps", "ns_coefficients", "adjust_lr_fn", NS_KEY, "muon_lr",
                   "adamw_betas", "adamw_eps", NONMATRIX_KEY),
                  "Muon (Jordan et al. 2024) on hidden 2-D matrices, AdamW on embeddings, head and 1-D tensors",
                  LAYOUT, groups=GROUPS, resolve_auto=resolve_auto, zero_incompatible="ZeRO hands the optimizer 1-D flat partitions and Muon orthogonalises 2-D "
                  "matrices (measured: torch.optim.Muon fails at step 1, 'Param gradient must be a 2D matrix')"),
)
