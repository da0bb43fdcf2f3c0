"""The memory planner's side of the report: its optimizer-state bytes for each run's own shapes (checked against
the measurement) and its predicted ratios at the GPT-2 sizes a sweep did not run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import CONFIG_FILE
from hf_optbench.study.records import RunRecord


def run_config(rec: RunRecord) -> dict[str, Any]:
    """The run's resolved config.yaml ({} when missing or unreadable)."""
    from hf_optbench.yaml_file import read_yaml_or_empty

    return read_yaml_or_empty(Path(rec.run_dir) / CONFIG_FILE)


def _planner_inputs(rec: RunRecord) -> dict[str, Any] | None:
    summary = rec.summary
    if not summary.get("embedding_rows") and not summary.get("vocab_size"):
        return None
    cfg = run_config(rec)
    return {"vocab_size": int(summary.get("embedding_rows") or summary["vocab_size"]),
            "n_positions": int(cfg.get("n_positions") or summary.get("block_size") or 1024),
            "embedding_state_32bit": bool(summary.get("embedding_state_32bit", True)),
            "pad_vocab_to_multiple_of": 1,
            "state_bytes": 2 if summary.get("precision") == "bf16-pure" else 4}


def planner_state(rec: RunRecord) -> int | None:
    """The planner's optimizer-state bytes for this run's shapes (None where it has no formula)."""
    from hf_optbench.measure.planner import gpt2_param_shapes, planned_optimizer_state_bytes

    inputs = _planner_inputs(rec)
    if inputs is None or not rec.optimizer or not rec.model_size:
        return None
    try:
        shapes = gpt2_param_shapes(rec.model_size, inputs["vocab_size"], inputs["n_positions"])
        return planned_optimizer_state_bytes(rec.optimizer, shapes, state_bytes=inputs["state_bytes"],
                                     embedding_state_32bit=inputs["embedding_state_32bit"])
    except OptBenchError:
        return None


def predicted_ratios(an: Any, baseline: str) -> list[dict[str, Any]]:
    """Planner-predicted optimizer-state ratios at the GPT-2 sizes the sweep did not run (marked predicted), in
    the setting the benchmark is about (GPT-2 from scratch with the Thai GPT-2 tokenizer): the 50,304-row embedding
    (GPT-2's and that tokenizer's vocabulary, padded) and 1,024 positions, whatever vocabulary the sweep itself
    used."""
    from hf_optbench.measure.planner import DEFAULT_VOCAB, gpt2_param_shapes, planned_optimizer_state_bytes
    from hf_optbench.models import GPT2_SIZES

    ref = next((r for r in an.ok() if _planner_inputs(r)), None)
    if ref is None:
        return []
    inputs = _planner_inputs(ref)
    assert inputs is not None
    out = []
    run_sizes = set(an.model_sizes)
    for size in GPT2_SIZES:
        if size in run_sizes or not size.startswith("gpt2"):
            continue
        shapes = gpt2_param_shapes(size, DEFAULT_VOCAB, 1024)
        n = sum(p.numel for p in shapes)
        base = planned_optimizer_state_bytes(baseline, shapes)
        for opt in an.optimizers:
            if opt == baseline:
                continue
            try:
                state = planned_optimizer_state_bytes(opt, shapes, embedding_state_32bit=inputs["embedding_state_32bit"])
            except OptBenchError:
                continue
            out.append({"optimizer": opt, "model_size": size, "num_params": n, "optimizer_state_bytes": state,
                        "baseline_state_bytes": base, "ratio": state / base})
    return out
