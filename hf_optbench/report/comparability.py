"""Which runs a report may compare: every setting but the compared ones (optimizer, model size, seed, and the
learning rate and weight decay each optimizer x size is tuned to) must match, or the report refuses.

Why: the report groups runs by optimizer x size and pools seeds, and pairs runs by seed across optimizers. A
directory holding runs of several sweeps (or runs started by hand) would otherwise be pooled silently: 3-step and
100-step runs averaged as "seeds", a 600-step run paired with a 20-step one, one GPU against two, beta2 0.5 with
0.99. What must match, and over which runs:

* every compared run: processes (world size), precision, ZeRO stage, block size, data source and tokenizer;
* the runs of one model size: tokens per optimizer step, and the step budget (max_steps; the baseline's ladder
  runs, ``__dx`` in their id, are at other budgets by design and are left out of that one check);
* across sizes: the same max_steps, or the same budget in tokens per parameter (within one step's rounding);
* in a sweep over several data ratios (``__tpp`` in the ids) "a size" above and below is a cell, a size at
  one ratio (``study.records.Cell``), and "across sizes" is across the sizes of one ratio: each ratio has its own
  budget, tuned values and ladder by design;
* the runs of one optimizer x size (the seeds the report pools, and the ladder's runs): every hyperparameter, tuned
  ones included, the schedule and its arguments, and the optimizer's constructor values; the learning rate is the
  ladder's one exception: each rung is tuned at its own budget, so its seeds share one rate, its own.
* the runs of one size, across optimizers (the pairs by seed): every other setting of the identity (dropout, warmup,
  data, batch, ...), except the optimizer's own hyperparameters and what the sweep file sets per optimizer.

A setting a run does not record (an older run directory) is not compared for that run. Values come from
summary.json and, where the run wrote one, its ``run_identity.json`` (the plan identity, :mod:`hf_optbench.run.plan`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import MANIFEST_FILE, read_identity
from hf_optbench.study.records import RunRecord, cells_of

# (name shown, how to read it from a record's summary and identity)
_Getter = Callable[[Mapping[str, Any], Mapping[str, Any]], Any]
EVERY_RUN: tuple[tuple[str, _Getter], ...] = (
    ("world_size", lambda s, i: s.get("world_size", i.get("world_size"))),
    ("precision", lambda s, i: s.get("precision")),
    ("zero_stage", lambda s, i: i.get("zero_stage")),
    ("block_size", lambda s, i: s.get("block_size", i.get("block_size"))),
    ("data source", lambda s, i: (s.get("data") or {}).get("source")),
    ("tokenizer", lambda s, i: (s.get("data") or {}).get("tokenizer", i.get("tokenizer_name"))),
    ("dataset", lambda s, i: [i.get(k) for k in ("data_source", "dataset_name", "dataset_config", "data_content")]
     if i else None),
)
PER_SIZE: tuple[tuple[str, _Getter], ...] = (
    ("tokens_per_step", lambda s, i: s.get("tokens_per_step")),
)
BUDGET: tuple[tuple[str, _Getter], ...] = (("max_steps", lambda s, i: s.get("max_steps", i.get("max_steps"))),)
# Param-group entries an optimizer or schedule updates as it runs (schedule-free's step count and weight sum):
# state, not settings.
_OPTIMIZER_STATE = {"initial_lr", "k", "weight_sum", "lr_max", "step", "train_mode"}
# Keys of the identity that are not a hyperparameter of the pooled runs (the seed varies, the rest is above).
_NOT_POOLED = {"seed", "data_seed", "max_steps", "world_size", "zero_stage", "block_size", "n_positions", "model_size",
               "optimizer", "schedule_resolved"}  # the schedule's steps follow max_steps (the ladder's differ)


# Identity keys that may differ between the optimizers of one size: each optimizer's own hyperparameters (cited,
# tuned or set per optimizer; each parameter group's rate and decay: run.plan), schedule included (a schedule-free
# optimizer runs none). Every other setting of the
# identity is the protocol, which the runs paired by seed must share: an edited sweep that kept its old runs paired
# dropout 0.3 with dropout 0 and one warmup with another.
PER_OPTIMIZER = frozenset({"optimizer", "optimizer_constructor", "learning_rate", "weight_decay", "max_grad_norm",
                           "schedule", "schedule_kwargs", "schedule_resolved", "min_lr_ratio", "embedding_state_32bit",
                           "param_groups"})


def _per_optimizer_keys(runs: Sequence[RunRecord]) -> set[str]:
    """:data:`PER_OPTIMIZER` and the keys the sweep file sets per optimizer (its manifest's ``per_optimizer``):
    a difference the user wrote on purpose."""
    keys = set(PER_OPTIMIZER)
    for sweep_dir in {Path(r.run_dir).parent.parent for r in runs if Path(r.run_dir).parent.name == "runs"}:
        try:
            table = json.loads((sweep_dir / MANIFEST_FILE).read_text(encoding="utf-8")).get("per_optimizer") or {}
            keys |= {str(k) for extra in table.values() if isinstance(extra, Mapping) for k in extra}
        except (OSError, ValueError, AttributeError):  # no manifest (runs gathered by hand): the fixed set
            continue
    return keys


# Identity keys the protocol check leaves out: the seed pairs the runs, the budget and the launch are checked above
# (the ladder runs at other max_steps by design), the size is the group.
_NOT_PROTOCOL = {"seed", "max_steps", "world_size", "zero_stage", "model_size"}


def _protocol(ident: Mapping[str, Any], free: set[str]) -> dict[str, Any]:
    """The identity's settings every run of one size must share, whatever its optimizer."""
    return {k: v for k, v in ident.items() if k not in free and k not in _NOT_PROTOCOL}


def _one_run_per_seed(compared: Sequence[RunRecord]) -> None:
    """Each seed once per optimizer x size: two runs of one seed (a size named twice, directories merged) would be
    pooled as two samples and paired twice."""
    seen: dict[tuple[str, str, Any], str] = {}
    for r in compared:
        key = (str(r.optimizer), r.cell.label, r.seed)
        if key[2] is not None and seen.setdefault(key, r.run_id) != r.run_id:
            raise OptBenchError(
                f"{key[0]}/{key[1]} runs {seen[key]} and {r.run_id} both have seed {key[2]}: the report would "
                "count one seed twice, as two samples. Report one sweep's directory, or move one of them elsewhere.")


def _pooled(summary: Mapping[str, Any], ident: Mapping[str, Any]) -> dict[str, Any]:
    """The settings every seed of one optimizer x size must share: hyperparameters, schedule, constructor values
    and, from the identity, everything else that changes the result."""
    out: dict[str, Any] = {k: summary.get(k) for k in ("learning_rate", "weight_decay", "max_grad_norm", "schedule",
                                                        "schedule_kwargs", "embedding_state_32bit")}
    for name, entry in (summary.get("hyperparameters") or {}).items():
        if name not in _OPTIMIZER_STATE:
            out[name] = entry.get("value") if isinstance(entry, Mapping) else entry
    out.update({k: v for k, v in ident.items() if k not in _NOT_POOLED})
    return {k: v for k, v in out.items() if v is not None}


def _rates(pooled: dict[str, Any]) -> Any:
    """Take the learning rates out of one run's pooled settings: its learning_rate and each parameter group's rate
    (the identity's ``param_groups``, whose other values, decay and betas, stay in the pool). A ladder rung runs at its
    own tuned rate, so its rates are compared per rung; the compared runs' are put back, under learning_rate."""
    rate = pooled.pop("learning_rate", None)
    groups = pooled.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, Mapping) for g in groups):
        return rate
    pooled["param_groups"] = [{k: v for k, v in g.items() if k != "lr"} for g in groups]
    return [rate, [g.get("lr") for g in groups]]


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _refuse(scope: str, key: str, by_value: Mapping[str, list[str]]) -> OptBenchError:
    """One line: the key, each value with the runs that have it, and the way out."""
    parts = []
    for value, ids in by_value.items():
        shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        parts.append(f"{value}: {shown}")
    return OptBenchError(
        f"{scope}runs differ in {key} ({'; '.join(parts)}): the report would pool or pair runs that are not "
        "comparable. Report one sweep's directory, or move the runs that do not belong to it elsewhere."
    )


def _check_key(scope: str, key: str, values: Sequence[tuple[str, Any]]) -> None:
    by_value: dict[str, list[str]] = {}
    for rid, value in values:
        if value is not None:
            by_value.setdefault(_show(value), []).append(rid)
    if len(by_value) > 1:
        raise _refuse(scope, key, by_value)


def _budget_across_sizes(budget_runs: Sequence[RunRecord]) -> None:
    """Across sizes: one max_steps for all, or one budget in tokens per parameter (each size's within one step)."""
    by_size: dict[str, tuple[int, float | None, str]] = {}
    for r in budget_runs:
        steps, tpp = r.summary.get("max_steps"), r.summary.get("tokens_per_param")
        if r.model_size and steps:
            by_size.setdefault(r.model_size, (int(steps), tpp, r.run_id))
    if len({steps for steps, _, _ in by_size.values()}) <= 1:
        return
    spans = [(tpp * (1 - 1 / steps), tpp * (1 + 1 / steps)) for steps, tpp, _ in by_size.values() if tpp]
    if len(spans) == len(by_size) and max(lo for lo, _ in spans) <= min(hi for _, hi in spans):
        return
    raise _refuse("", "budget across model sizes: neither max_steps nor tokens_per_param agree",
                  {f"{size} {steps} steps, {tpp if tpp is None else round(tpp, 4)} tokens/param": [rid]
                   for size, (steps, tpp, rid) in by_size.items()})


def check_comparable(compared: Sequence[RunRecord], ladder: Sequence[RunRecord]) -> None:
    """Raise OptBenchError naming the first setting the finished runs the report compares (``compared``) and the
    baseline's ladder runs (``ladder``) do not share, with the runs of each value."""
    runs = [r for r in [*compared, *ladder] if r.summary]
    idents = {r.run_id: read_identity(Path(r.run_dir)) or {} for r in runs}

    def values(subset: Sequence[RunRecord], get: _Getter) -> list[tuple[str, Any]]:
        return [(r.run_id, get(r.summary, idents[r.run_id])) for r in subset]

    for key, get in EVERY_RUN:
        _check_key("", key, values(runs, get))
    ladder_ids = {r.run_id for r in ladder}
    sizes = cells_of(runs)
    for size in sizes:
        of_size = [r for r in runs if r.cell.label == size]
        for key, get in PER_SIZE:
            _check_key(f"{size} ", key, values(of_size, get))
        for key, get in BUDGET:
            _check_key(f"{size} ", key, values([r for r in of_size if r.run_id not in ladder_ids], get))
    for tpp in {r.budget_tpp for r in runs}:
        _budget_across_sizes([r for r in runs if r.run_id not in ladder_ids and r.budget_tpp == tpp])
    free = _per_optimizer_keys(runs)
    for size in sizes:
        protocol = {r.run_id: _protocol(idents[r.run_id], free) for r in runs if r.cell.label == size}
        for key in sorted({k for p in protocol.values() for k in p}):
            _check_key(f"{size} ", key, [(rid, p.get(key)) for rid, p in protocol.items()])
    _one_run_per_seed([r for r in runs if r.run_id not in ladder_ids])
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for r in runs:  # the ladder too: it differs from the comparison in max_steps only, left out of the pool's keys
        groups.setdefault((str(r.optimizer), r.cell.label), []).append(r)
    for (opt, size), members in sorted(groups.items()):
        pooled = {r.run_id: _pooled(r.summary, idents[r.run_id]) for r in members}
        rungs: dict[Any, list[tuple[str, Any]]] = {}
        for r in members:  # every ladder rung runs at its own tuned rate: one rate per rung, not per group
            rates = _rates(pooled[r.run_id])
            if r.run_id in ladder_ids:
                rungs.setdefault(r.budget_multiple, []).append((r.run_id, rates))
            elif rates is not None:
                pooled[r.run_id]["learning_rate"] = rates
        for key in sorted({k for p in pooled.values() for k in p}):
            _check_key(f"{opt}/{size} ", key, [(rid, p.get(key)) for rid, p in pooled.items()])
        for multiple, rates in sorted(rungs.items(), key=lambda kv: float(kv[0] or 1.0)):
            _check_key(f"{opt}/{size} x{float(multiple or 1.0):g} budget ", "learning_rate", rates)
