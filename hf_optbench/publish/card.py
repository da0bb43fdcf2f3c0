"""The model card (``README.md``) of a run, built from its ``summary.json`` by the Hub's conventions.

A checkpoint trained by this benchmark is a measurement, not a text generator: the card leads with the
benchmark figures (memory, speed, losses) and the setup needed to reproduce them. Its YAML metadata follows the
Hub's model-card spec (huggingface/hub-docs ``modelcard.md``, written here through huggingface_hub's
``ModelCardData``/``EvalResult``): ``license``, ``language``, ``datasets``, ``library_name``, ``tags``, and a
``model-index`` whose metrics are evaluation results only (final eval loss and perplexity), each tagged with the
optimizer and size; the training facts (tokens, parameters, optimizer-state and peak memory) are in the
``hf_optbench`` metadata block and the benchmark table. The data is described as it was used:
only a run that streamed a Hub dataset names it under ``datasets`` (``allenai/c4`` for mC4 Thai); synthetic,
bundled or local data is described, never attributed to a Hub dataset.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_optbench.publish.redact import scrub_secrets
from hf_optbench.rundir import CONFIG_FILE, read_metrics, read_summary, write_text_atomic

C4 = "allenai/c4"  # mC4 is allenai/c4's multilingual part; its config is the language code ("th")

# summary.json keys copied into the card's YAML metadata (the `hf_optbench` block).
KEY_FIGURES = ("optimizer", "optimizer_impl", "model_size", "num_params", "steps", "tokens_seen", "final_train_loss",
               "final_eval_loss", "optimizer_state_bytes", "optimizer_state_bytes_total", "peak_memory_bytes",
               "peak_memory_kind", "tokens_per_s", "world_size", "seed", "status")


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _fmt_int(v: Any) -> str:
    return f"{int(v):,}" if _finite(v) else "n/a"


def _fmt_float(v: Any, digits: int = 4) -> str:
    if _finite(v):
        return f"{v:,.0f}" if abs(v) >= 10**digits else f"{v:.{digits}g}"
    return "n/a"


def _fmt_bytes(v: Any) -> str:
    if not _finite(v):
        return "n/a"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= size:
            return f"{v / size:.2f} {unit} ({int(v):,} B)"
    return f"{int(v):,} B"


def _fmt_seconds(v: Any) -> str:
    """Three significant digits under 10 s (a 12 ms step is "0.0123 s", not "0.0 s"), else tenths or minutes."""
    if not _finite(v):
        return "n/a"
    if v < 10:
        return f"{v:.3g} s"
    return f"{v:.1f} s" if v < 120 else f"{v / 60:.1f} min"


@dataclass(frozen=True)
class DataCard:
    """What the card says about the data: the model-index ``dataset`` entry, and ``datasets``/``language``
    metadata only where they are true (a Hub dataset that was streamed; a Thai source)."""

    type: str  # model-index dataset.type: the Hub id for Hub data, else a descriptive id
    name: str  # model-index dataset.name, and the card's "data" row
    hub_id: str | None = None  # the `datasets:` metadata entry; None for data not read from the Hub
    config: str | None = None
    split: str | None = None
    language: str | None = None
    args: dict[str, Any] | None = None  # how the eval split was held out


def read_run_config(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The run's resolved ``config.yaml`` (written at its start), or {} when missing or unreadable."""
    from hf_optbench.yaml_file import read_yaml_or_empty

    return read_yaml_or_empty(Path(run_dir) / CONFIG_FILE)


def _language_code(value: Any) -> str | None:
    return value if isinstance(value, str) and re.fullmatch(r"[a-z]{2,3}", value) else None


def describe_data(summary: dict[str, Any], config: dict[str, Any]) -> DataCard:
    """The data a run trained on, from ``config.yaml`` (source, dataset, config, split) and ``summary["data"]``.

    Only ``data_source: hub`` names a Hub dataset; local files in the c4 layout are described as local files
    (they may be a subset, or edited), synthetic data as the generator that made it."""
    info = _dict_at(summary, "data")
    kind = config.get("data_source") or info.get("data_source")
    source = str(info.get("source") or kind or "custom")
    held_out = {k: info[k] for k in ("split_seed", "eval_tokens", "block_size") if k in info} or None
    config_name = config.get("dataset_config")
    split = config.get("dataset_split")
    if kind == "hub":
        name = str(config.get("dataset_name") or "")
        if not name:  # config.yaml missing: the source description is "hub: NAME/CONFIG split SPLIT (streamed)"
            found = re.match(r"hub: (.+)/([^/ ]+) split (\S+)", source)
            name, config_name, split = found.groups() if found else (source, None, None)
        is_c4 = name.rstrip("/").split("/")[-1] == "c4"
        language = _language_code(config_name) if is_c4 else None
        pretty = f"mC4 Thai ({name}, config {config_name})" if is_c4 and config_name == "th" else \
            f"{name}" + (f" (config {config_name})" if config_name else "")
        return DataCard(name, pretty, hub_id=name, config=config_name, split=split, language=language,
                        args=held_out)
    if kind == "thai_sample":
        return DataCard("hf-optbench-thai-sample", "hf_optbench's bundled Thai sample (20 original documents)",
                        split="eval", language="th", args=held_out)
    if kind == "synthetic":
        return DataCard("synthetic-hmm", source, split="eval", args=held_out)
    if kind == "local":
        c4_layout = "(c4 layout)" in source
        language = _language_code(config_name) if c4_layout else None
        return DataCard("local-files", source, config=config_name if c4_layout else None,
                        split=split if c4_layout else None, language=language, args=held_out)
    return DataCard("custom", source, args=held_out)


def _dict_at(mapping: dict[str, Any], key: str) -> dict[str, Any]:
    value = mapping.get(key)
    return value if isinstance(value, dict) else {}


def benchmark_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of the card's benchmark table, each value formatted from ``summary.json``."""
    state_total = summary.get("optimizer_state_bytes_total", summary.get("optimizer_state_bytes"))
    return [
        ("optimizer", f"`{summary.get('optimizer', 'n/a')}` ({summary.get('optimizer_impl', 'n/a')})"),
        ("model size", f"{summary.get('model_size', 'n/a')} ({_fmt_int(summary.get('num_params'))} parameters)"),
        ("steps", _fmt_int(summary.get("steps"))),
        ("tokens seen", _fmt_int(summary.get("tokens_seen"))),
        ("tokens per step", _fmt_int(summary.get("tokens_per_step"))),
        ("final train loss", _fmt_float(summary.get("final_train_loss"))),
        ("final eval loss", _fmt_float(summary.get("final_eval_loss"))),
        ("optimizer state (all ranks)", _fmt_bytes(state_total)),
        ("optimizer state per rank", _fmt_bytes(summary.get("optimizer_state_bytes"))),
        ("optimizer state bytes / parameter", _fmt_float(summary.get("optimizer_state_bytes_per_param"), 3)),
        (f"peak memory ({summary.get('peak_memory_kind', 'n/a')})", _fmt_bytes(summary.get("peak_memory_bytes"))),
        ("throughput", f"{_fmt_float(summary.get('tokens_per_s'), 4)} tokens/s"),
        ("median step time", _fmt_seconds(summary.get("step_time_median_s"))),
        ("MFU", _fmt_float(summary.get("mfu"), 3)),
        ("loss spikes", _fmt_int(summary.get("loss_spikes"))),
        ("train runtime", _fmt_seconds(summary.get("train_runtime_s"))),
        ("status", str(summary.get("status", "n/a"))),
    ]


def _weight_decay_cell(summary: dict[str, Any]) -> str:
    """The weight decay that ran, per param group when the groups differ ("0.1 on 10 tensors, 0 on 18")."""
    groups = [g for g in summary.get("param_groups") or [] if isinstance(g, dict)]
    decays = {g.get("weight_decay") for g in groups}
    if len(decays) < 2:
        return _fmt_float(summary.get("weight_decay"))
    return ", ".join(f"{_fmt_float(g.get('weight_decay'))} on {_fmt_int(g.get('tensors'))} tensors" for g in groups)


def _hyperparameters_cell(summary: dict[str, Any]) -> str:
    """The optimizer's other values as it ran them (summary.json ``hyperparameters``), e.g. "betas [0.9, 0.99],
    eps 1e-08, max_grad_norm 1"; rate and decay have rows of their own."""
    hp = _dict_at(summary, "hyperparameters")
    cells = [f"{k} {json.dumps(v.get('value'))}" for k, v in hp.items()
             if isinstance(v, dict) and k not in ("learning_rate", "weight_decay")]
    return ", ".join(cells) or "n/a"


def _clipping_cell(summary: dict[str, Any]) -> str:
    """The gradient clipping the run trained with: its max norm, "off" (0 or none), or n/a (not recorded)."""
    if "max_grad_norm" not in summary:
        return "n/a"
    value = summary.get("max_grad_norm")
    return f"max norm {_fmt_float(value)}" if _finite(value) and float(value) > 0 else "off"


def setup_rows(summary: dict[str, Any], data: DataCard | None = None) -> list[tuple[str, str]]:
    """(label, value) rows of the card's training-setup table: what a reader needs to reproduce the run, the
    optimizer's values as it ran them."""
    s = summary
    env = _dict_at(s, "env")
    packages = _dict_at(env, "packages")
    git = _dict_at(s, "git")
    return [
        ("learning rate", _fmt_float(s.get("learning_rate"))),
        ("weight decay", _weight_decay_cell(s)),
        ("optimizer hyperparameters", _hyperparameters_cell(s)),
        ("schedule", f"{s.get('schedule', 'n/a')} {json.dumps(s.get('schedule_kwargs', {}), sort_keys=True)}"),
        ("micro batch x accumulation x processes",
         f"{s.get('micro_batch_size', 'n/a')} x {s.get('gradient_accumulation_steps', 'n/a')} x "
         f"{s.get('world_size', 'n/a')}"),
        ("block size", str(s.get("block_size", "n/a"))),
        ("precision", str(s.get("precision", "n/a"))),
        ("gradient clipping", _clipping_cell(s)),
        ("seed", str(s.get("seed", "n/a"))),
        ("data", (data or describe_data(s, {})).name),
        ("device", f"{env.get('device', 'n/a')} x {env.get('device_count', 'n/a')}"),
        ("torch / transformers", f"{packages.get('torch', 'n/a')} / {packages.get('transformers', 'n/a')}"),
        ("hf_optbench commit", f"{git.get('commit') or 'n/a'}{' (uncommitted changes)' if git.get('dirty') else ''}"),
    ]


# model-index metrics: (summary.json key, metric type, metric name). Types follow the Hub's lower-case ids. Only
# evaluation results: tokens, parameters and bytes are facts of the training, in the `hf_optbench` metadata block
# and the benchmark table.
MODEL_INDEX_METRICS = (
    ("final_eval_loss", "loss", "final eval loss (nats/token)"),
)


def _eval_results(summary: dict[str, Any], data: DataCard) -> list[Any] | None:
    """model-index entries: the evaluation results (final eval loss and perplexity) of one result (task, dataset,
    split), each tagged with the optimizer and size (``args``); None when the run measured none of them."""
    from huggingface_hub import EvalResult

    optimizer, size = str(summary.get("optimizer", "unknown")), str(summary.get("model_size", "unknown"))
    common = dict(task_type="text-generation", task_name=f"GPT-2 {size} pretraining with {optimizer} (hf_optbench)",
                  dataset_type=data.type, dataset_name=data.name, dataset_config=data.config,
                  dataset_split=data.split, dataset_args=data.args)
    tagged = {"optimizer": optimizer, "model_size": size}
    results = []
    for key, metric_type, metric_name in MODEL_INDEX_METRICS:
        value = summary.get(key)
        if not _finite(value):
            continue
        results.append(EvalResult(metric_type=metric_type, metric_name=metric_name, metric_value=float(value),
                                  metric_args=tagged, **common))
        if key == "final_eval_loss" and value < 50:  # exp() of a diverged loss is not a number worth showing
            results.append(EvalResult(metric_type="perplexity", metric_name="final eval perplexity",
                                      metric_value=float(math.exp(value)), metric_args=tagged, **common))
    return results or None


def _table(rows: list[tuple[str, str]]) -> str:
    return "\n".join(f"| {label} | {value} |" for label, value in rows)


def rerun_command(prefix: str | None, config: str, output_dir: str) -> str:
    """The command that reruns a run from its config.yaml into ``output_dir``: under its launcher (``prefix``, the
    summary's ``launch.rerun_prefix``: ``accelerate launch --config_file ...``) when it had one or ran on several
    processes, else ``hf-optbench run``. Why the launcher: a 2-process run rerun as one process trains on half the
    tokens per step, another run (config.yaml's ``num_processes`` refuses it)."""
    import shlex  # a path with spaces or shell syntax is one argument when the line is pasted into a shell

    if prefix:
        return f"{prefix} -m hf_optbench.run {shlex.quote(config)} --output_dir {shlex.quote(output_dir)}"
    return f"hf-optbench run {shlex.quote(config)} --output_dir {shlex.quote(output_dir)}"


def reproduce_command(summary: dict[str, Any], config: dict[str, Any], uploaded: bool = False) -> str | None:
    """The command that reruns the run: its own config.yaml (every resolved value, CLI overrides included) into a
    new output_dir, under the launcher it ran with (:func:`rerun_command`); the recipe only for a run directory
    without one. ``uploaded``: the card of a Hub repo, whose reader has the repo's config.yaml, not this machine's
    paths. None when nothing records how the run was made (a Trainer script of the Python API: no config.yaml,
    no recipe)."""
    out = config.get("output_dir")
    prefix = _dict_at(summary, "launch").get("rerun_prefix")
    if out and uploaded:
        return rerun_command(prefix, CONFIG_FILE, f"{Path(out).name}_rerun")
    if out:
        return rerun_command(prefix, str(Path(out) / CONFIG_FILE), f"{out}_rerun")
    recipe = summary.get("recipe")
    return f"hf-optbench run {recipe}" if recipe else None


# What the Reproduce section says of a run no file records the settings of.
NOT_REPRODUCIBLE = ("This run was trained by a script of its own (a `transformers.Trainer` through hf_optbench's "
                    "Python API): no `config.yaml` records its settings, so no command here reruns it. What ran is "
                    "in `summary.json` (optimizer, every hyperparameter with its source, schedule, batch, "
                    "versions); the script itself is not part of this upload.")


def card_gaps(run_dir: str | os.PathLike[str]) -> list[str]:
    """What a reproducible card of this run lacks, one line each (empty when nothing): no config.yaml (no command
    reruns it), no tokenizer files (the model cannot be used on text). ``push`` prints them."""
    run = Path(run_dir)
    gaps = []
    if not (run / CONFIG_FILE).is_file():
        gaps.append(f"no {CONFIG_FILE}: the run was not started by `hf-optbench run`, so its card names no command "
                    "that reruns it (its Reproduce section says so)")
    tokenizers = ("tokenizer.json", "vocab.json", "tokenizer.model")  # where staging takes them: the run or a checkpoint
    if not any(next(run.glob(where + name), None) for where in ("", "checkpoint-*/") for name in tokenizers):
        gaps.append("no tokenizer files: the uploaded model cannot be used on text (save the tokenizer into the run "
                    "directory, e.g. Trainer(processing_class=tokenizer), before pushing)")
    return gaps


def _card_body(name: str, summary: dict[str, Any], data: DataCard, note: str, reproduce: str | None) -> str:
    size, optimizer = summary.get("model_size", "unknown"), summary.get("optimizer", "unknown")
    how = NOT_REPRODUCIBLE if reproduce is None else f"""```
{reproduce}
```

The run directory's `config.yaml` holds every resolved value (recipe, command-line overrides, cited defaults)."""
    return f"""
# {name}

GPT-2 `{size}` trained from scratch with `{optimizer}` by hf_optbench, an optimizer benchmark for GPT-2
pretraining. This checkpoint is a benchmark artefact: its purpose is the measurement below
(memory, speed, convergence of one optimizer at one size), not text generation quality.

## Benchmark summary

| measure | value |
|---|---|
{_table(benchmark_rows(summary))}

## Training setup

| setting | value |
|---|---|
{_table(setup_rows(summary, data))}

## Reproduce

{how}

{note}
"""


def build_model_card(run_dir: str | os.PathLike[str], repo_id: str | None = None, *,
                     summary: dict[str, Any] | None = None, license_id: str | None = None) -> Any:
    """A ``huggingface_hub.ModelCard`` for a run: Hub metadata (license, language, datasets, library, tags,
    model-index with the benchmark summary, an ``hf_optbench`` block of the key figures) and a Markdown body.

    ``summary`` replaces ``summary.json`` (a card for a checkpoint uploaded while the run trains). The license is
    ``license_id``, else the run's ``model_card_license``, else none: the weights' license is the user's to choose."""
    from huggingface_hub import ModelCard, ModelCardData

    from_file = summary is None
    s = scrub_secrets(read_summary(Path(run_dir), required=True) if from_file else summary)
    config = read_run_config(run_dir)
    data = describe_data(s, config)
    optimizer = str(s.get("optimizer", "unknown"))
    size = str(s.get("model_size", "unknown"))
    name = repo_id.split("/")[-1] if repo_id else f"gpt2-{size}-{optimizer}-hf-optbench"
    card_data = ModelCardData(
        license=license_id or config.get("model_card_license") or None,
        language=[data.language] if data.language else None,
        datasets=[data.hub_id] if data.hub_id else None,
        library_name="transformers",
        pipeline_tag="text-generation",
        model_name=name,
        tags=["hf-optbench", "optimizer-benchmark", "gpt2", "pretraining", optimizer],
        eval_results=_eval_results(s, data),
        hf_optbench={k: s.get(k) for k in KEY_FIGURES if k in s},
    )
    note = ("Figures come from this run's `summary.json`; the per-step curves are in its `metrics.jsonl`."
            if from_file else f"Training in progress: figures at step {s.get('steps', '?')}, from `metrics.jsonl`.")
    body = _card_body(name, s, data, note, reproduce_command(s, config, uploaded=repo_id is not None))
    return ModelCard(f"---\n{card_data.to_yaml()}\n---\n{body}")


def write_model_card(run_dir: str | os.PathLike[str], repo_id: str | None = None) -> Path:
    """Write ``README.md`` (the model card) into ``run_dir`` from its ``summary.json``; returns its path."""
    card = build_model_card(run_dir, repo_id=repo_id)
    return write_text_atomic(Path(run_dir) / "README.md", str(card))


def progress_summary(run_dir: str | os.PathLike[str], step: int, log_history: list[dict[str, Any]]) -> dict[str, Any]:
    """What the card of a checkpoint uploaded mid-run can say: optimizer, size and seed (config.yaml), the step,
    tokens so far (metrics.jsonl), the latest train and eval loss (the Trainer's log history)."""
    config = read_run_config(run_dir)
    summary = {k: config[k] for k in ("optimizer", "model_size", "seed") if k in config}
    train = [r["loss"] for r in log_history if "loss" in r]
    evals = [r["eval_loss"] for r in log_history if "eval_loss" in r]
    rows = [r for r in read_metrics(run_dir).get("train", []) if r.get("step", 0) <= step]
    summary.update(steps=step, status="in progress", final_train_loss=train[-1] if train else None,
                   final_eval_loss=evals[-1] if evals else None, tokens_seen=rows[-1].get("tokens") if rows else None)
    return summary
