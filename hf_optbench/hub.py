"""Share a finished run on the Hugging Face Hub: model card from its benchmark summary, a checked upload folder,
and the upload itself through ``huggingface_hub``.

    hf-optbench push runs/lion_gpt2_s0 --repo-id me/gpt2-lion-bench --dry-run   # stage + check, no network
    hf-optbench push runs/lion_gpt2_s0 --repo-id me/gpt2-lion-bench             # upload (private by default)

Why a staged folder instead of uploading ``output_dir``: a run directory also holds pickled files
(``training_args.bin``, ``optimizer.pt``, ``rng_state.pth``) and the optimizer state of every checkpoint. The Hub
gets exactly the files a user needs to load the model (safetensors weights, config, tokenizer, card), and each
is checked for pickles and token strings before anything leaves the machine.

Secrets: the token comes from ``HF_TOKEN`` or the login cache (``hf auth login``) through
``huggingface_hub.get_token()``; it is never accepted on the command line, never printed, and
:func:`scrub_secrets` removes it from anything the run writes (``config.yaml``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from .errors import OptBenchError

# An HF user-access token is "hf_" followed by ~34 letters/digits; 30+ catches it without matching identifiers.
HF_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{30,}")
REDACTED = "<redacted>"
# Keys whose value is a secret whatever it looks like (TrainingArguments.hub_token, W&B keys, ...).
SECRET_KEYS = frozenset({"hub_token", "hf_token", "token", "use_auth_token", "push_to_hub_token",
                         "wandb_api_key", "api_key", "password", "secret"})

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
MODEL_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "added_tokens.json", "chat_template.jinja", "tokenizer.model")
# Suffixes of files that torch/pickle would deserialise by executing code: never part of an upload.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
DEFAULT_STAGE_DIRNAME = "hub_upload"
_STAGE_MARKER = ".hf_optbench_stage"


# --------------------------------------------------------------------------------------------------- secrets


def _is_secret_key(key: Any) -> bool:
    return isinstance(key, str) and key.lower() in SECRET_KEYS


def scrub_secrets(obj: Any) -> Any:
    """A copy of ``obj`` (dicts/lists/tuples/strings, nested) without secrets.

    Keys in :data:`SECRET_KEYS` (``hub_token``, ...) are dropped entirely, and every substring that looks like an
    HF token (``hf_`` + 30 or more letters/digits) is replaced by ``<redacted>``, wherever it appears (a token
    pasted into ``run_name`` or a URL is caught too). Other objects are returned unchanged.
    """
    if isinstance(obj, dict):
        return {k: scrub_secrets(v) for k, v in obj.items() if not _is_secret_key(k)}
    if isinstance(obj, list):
        return [scrub_secrets(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(scrub_secrets(v) for v in obj)
    if isinstance(obj, str):
        return HF_TOKEN_RE.sub(REDACTED, obj)
    return obj


def _known_token() -> str | None:
    """The token huggingface_hub would use (env or login cache), to search staged files for it literally."""
    try:
        from huggingface_hub import get_token
    except ImportError:  # pragma: no cover - huggingface_hub is a core dependency
        return os.environ.get("HF_TOKEN")
    return get_token()


# ------------------------------------------------------------------------------------------------ model card


def _read_summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "summary.json"
    if not path.is_file():
        raise OptBenchError(
            f"'{run_dir}' has no summary.json: it is not an hf_optbench run directory, or the run has not "
            "finished. Point at a run's output_dir (the folder holding summary.json and metrics.jsonl)."
        )
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise OptBenchError(f"{path} is not valid JSON ({exc}): re-run or repair the run directory.") from exc


def _fmt_int(v: Any) -> str:
    return f"{int(v):,}" if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else "n/a"


def _fmt_float(v: Any, digits: int = 4) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return f"{v:,.0f}" if abs(v) >= 10**digits else f"{v:.{digits}g}"
    return "n/a"


def _fmt_bytes(v: Any) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        return "n/a"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= size:
            return f"{v / size:.2f} {unit} ({int(v):,} B)"
    return f"{int(v):,} B"


def _fmt_seconds(v: Any) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        return "n/a"
    return f"{v:.1f} s" if v < 120 else f"{v / 60:.1f} min"


def _dataset_name(summary: dict[str, Any]) -> str:
    data = summary.get("data")
    if isinstance(data, dict):
        for key in ("name", "source", "description", "data_source"):
            if isinstance(data.get(key), str) and data[key]:
                return data[key]
    return str(data) if isinstance(data, str) and data else "custom"


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


def build_model_card(run_dir: str | os.PathLike[str], repo_id: str | None = None) -> Any:
    """A ``huggingface_hub.ModelCard`` for a run: YAML metadata (tags, model-index with the eval loss, an
    ``hf_optbench`` block of the key figures) and a Markdown body with the benchmark summary."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    run_dir = Path(run_dir)
    s = scrub_secrets(_read_summary(run_dir))
    optimizer = str(s.get("optimizer", "unknown"))
    size = str(s.get("model_size", "unknown"))
    name = repo_id.split("/")[-1] if repo_id else f"gpt2-{size}-{optimizer}-hf-optbench"
    eval_results = None
    eval_loss = s.get("final_eval_loss")
    if isinstance(eval_loss, (int, float)) and math.isfinite(eval_loss):
        dataset = _dataset_name(s)
        eval_results = [
            EvalResult(task_type="text-generation", dataset_type=dataset, dataset_name=dataset,
                       metric_type="loss", metric_name="eval loss", metric_value=float(eval_loss)),
        ]
        if eval_loss < 50:  # exp() of a diverged loss is not a number worth showing
            eval_results.append(
                EvalResult(task_type="text-generation", dataset_type=dataset, dataset_name=dataset,
                           metric_type="perplexity", metric_name="eval perplexity",
                           metric_value=float(math.exp(eval_loss))))
    key_figures = {k: s.get(k) for k in (
        "optimizer", "optimizer_impl", "model_size", "num_params", "steps", "tokens_seen", "final_train_loss",
        "final_eval_loss", "optimizer_state_bytes", "optimizer_state_bytes_total", "peak_memory_bytes",
        "peak_memory_kind", "tokens_per_s", "world_size", "seed", "status") if k in s}
    card_data = ModelCardData(
        library_name="transformers",
        pipeline_tag="text-generation",
        model_name=name,
        tags=["hf-optbench", "optimizer-benchmark", "gpt2", "pretraining", optimizer],
        eval_results=eval_results,
        hf_optbench=key_figures,
    )
    env = s.get("env") if isinstance(s.get("env"), dict) else {}
    packages = env.get("packages") if isinstance(env.get("packages"), dict) else {}
    git = s.get("git") if isinstance(s.get("git"), dict) else {}
    table = "\n".join(f"| {label} | {value} |" for label, value in benchmark_rows(s))
    setup = [
        ("learning rate", _fmt_float(s.get("learning_rate"))),
        ("weight decay", _fmt_float(s.get("weight_decay"))),
        ("schedule", f"{s.get('schedule', 'n/a')} {json.dumps(s.get('schedule_kwargs', {}), sort_keys=True)}"),
        ("micro batch x accumulation x processes",
         f"{s.get('micro_batch_size', 'n/a')} x {s.get('gradient_accumulation_steps', 'n/a')} x "
         f"{s.get('world_size', 'n/a')}"),
        ("block size", str(s.get("block_size", "n/a"))),
        ("precision", str(s.get("precision", "n/a"))),
        ("seed", str(s.get("seed", "n/a"))),
        ("data", _dataset_name(s)),
        ("device", f"{env.get('device', 'n/a')} x {env.get('device_count', 'n/a')}"),
        ("torch / transformers", f"{packages.get('torch', 'n/a')} / {packages.get('transformers', 'n/a')}"),
        ("hf_optbench commit", f"{git.get('commit') or 'n/a'}{' (uncommitted changes)' if git.get('dirty') else ''}"),
    ]
    setup_table = "\n".join(f"| {label} | {value} |" for label, value in setup)
    recipe = s.get("recipe")
    reproduce = f"hf-optbench run {recipe}" if recipe else "hf-optbench run RECIPE.yaml"
    body = f"""
# {name}

GPT-2 `{size}` trained from scratch with `{optimizer}` by hf_optbench, an optimizer benchmark for GPT-2
pretraining. This checkpoint is a benchmark artefact: its purpose is the measurement below
(memory, speed, convergence of one optimizer at one size), not text generation quality.

## Benchmark summary

| measure | value |
|---|---|
{table}

## Training setup

| setting | value |
|---|---|
{setup_table}

## Reproduce

```
{reproduce}
```

Figures come from this run's `summary.json`; the per-step curves are in its `metrics.jsonl`.
"""
    return ModelCard(f"---\n{card_data.to_yaml()}\n---\n{body}")


def write_model_card(run_dir: str | os.PathLike[str], repo_id: str | None = None) -> Path:
    """Write ``README.md`` (the model card) into ``run_dir`` from its ``summary.json``; returns its path."""
    path = Path(run_dir) / "README.md"
    card = build_model_card(run_dir, repo_id=repo_id)
    path.write_text(str(card), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------- upload folder


def _checkpoint_step(path: Path) -> int:
    try:
        return int(path.name.split("-", 1)[1])
    except (IndexError, ValueError):
        return -1


def _has_weights(folder: Path) -> bool:
    return any((folder / name).is_file() for name in WEIGHT_FILES)


def find_weights_dir(run_dir: str | os.PathLike[str]) -> Path:
    """Where the run's final weights are: ``run_dir`` itself if the final model was saved there, else its
    latest ``checkpoint-N`` (Trainer saves one at the last step)."""
    run_dir = Path(run_dir)
    if _has_weights(run_dir):
        return run_dir
    checkpoints = sorted((p for p in run_dir.glob("checkpoint-*") if p.is_dir() and _has_weights(p)),
                         key=_checkpoint_step)
    if checkpoints:
        return checkpoints[-1]
    pickled = [p.name for p in run_dir.glob("*") if p.suffix in PICKLE_SUFFIXES]
    extra = f" (found only pickled {pickled}: re-save them as safetensors)" if pickled else ""
    raise OptBenchError(
        f"no safetensors weights in '{run_dir}' or its checkpoint-* folders{extra}. Run with checkpoints "
        "enabled (--save_strategy steps --save_steps N; one is saved at the last step) before pushing."
    )


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # no second copy of multi-GB weights on disk
    except OSError:
        shutil.copy2(src, dst)


def _file_contains_token(path: Path, token: str | None, chunk: int = 8 << 20) -> bool:
    """Stream the file (weights can be GBs) looking for a token-like string or ``token`` itself."""
    needle = token.encode() if token else None
    overlap = 256  # longer than any token, so a match split across two chunks is still seen
    tail = b""
    with path.open("rb") as f:
        while block := f.read(chunk):
            window = tail + block
            if HF_TOKEN_RE.search(window.decode("latin-1")) or (needle and needle in window):
                return True
            tail = window[-overlap:]
    return False


def check_upload_folder(folder: str | os.PathLike[str], token: str | None = None) -> list[str]:
    """Problems that must stop an upload (empty list = fine): missing weights/config/card, pickled files,
    unreadable safetensors, or any file containing an HF-token-like string or ``token`` itself."""
    from safetensors import safe_open

    folder = Path(folder)
    problems: list[str] = []
    if not _has_weights(folder):
        problems.append("no model.safetensors (or model.safetensors.index.json)")
    for name in ("config.json", "README.md"):
        if not (folder / name).is_file():
            problems.append(f"missing {name}")
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder)
        if path.name == _STAGE_MARKER:
            continue
        if path.suffix in PICKLE_SUFFIXES:
            problems.append(f"{rel}: pickled file (loading it can run code); only safetensors are uploaded")
        if path.suffix == ".safetensors":
            try:
                with safe_open(str(path), framework="pt") as f:
                    f.keys()
            except Exception as exc:  # safetensors raises its own error types
                problems.append(f"{rel}: not a readable safetensors file ({exc})")
        if _file_contains_token(path, token):
            problems.append(f"{rel}: contains a Hugging Face token")
    return problems


def stage_upload_folder(run_dir: str | os.PathLike[str], dest: str | os.PathLike[str] | None = None, *,
                        repo_id: str | None = None, token: str | None = None) -> Path:
    """Assemble exactly what an upload of this run would send, and check it.

    The folder (default ``run_dir/hub_upload``) holds the final safetensors weights (and shard index), config.json,
    generation_config.json if any, the tokenizer files, and README.md (the benchmark model card). Raises
    OptBenchError listing the problems if :func:`check_upload_folder` finds any (e.g. a token string).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise OptBenchError(f"run directory '{run_dir}' does not exist: pass a run's output_dir.")
    card = build_model_card(run_dir, repo_id=repo_id)  # fails early without summary.json
    source = find_weights_dir(run_dir)
    dest = Path(dest) if dest is not None else run_dir / DEFAULT_STAGE_DIRNAME
    if dest.exists():
        if not (dest / _STAGE_MARKER).is_file():
            raise OptBenchError(
                f"staging folder '{dest}' exists and was not made by hf-optbench: choose another --stage-dir, "
                "or remove it."
            )
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    (dest / _STAGE_MARKER).write_text("made by hf_optbench.hub.stage_upload_folder\n", encoding="utf-8")

    files: list[Path] = [source / n for n in WEIGHT_FILES + MODEL_FILES if (source / n).is_file()]
    index = source / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values()))
        files += [source / shard for shard in shards]
    for name in TOKENIZER_FILES:  # the checkpoint's copy first, else the one saved at the run's top level
        for where in (source, run_dir):
            if (where / name).is_file():
                files.append(where / name)
                break
    for src in files:
        if not src.is_file():
            raise OptBenchError(f"'{src}' is listed in the shard index but missing: the checkpoint is incomplete.")
        _link_or_copy(src, dest / src.name)
    (dest / "README.md").write_text(str(card), encoding="utf-8")

    problems = check_upload_folder(dest, token=token if token is not None else _known_token())
    if problems:
        raise OptBenchError(
            f"the upload folder '{dest}' failed its checks: " + "; ".join(problems)
            + ". Fix the run directory (weights as safetensors, no tokens in configs) and stage again."
        )
    return dest


# ------------------------------------------------------------------------------------------------- upload


def _hub_offline() -> bool:
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE", "")
    return bool(constants.HF_HUB_OFFLINE) or flag.strip().upper() in ("1", "ON", "YES", "TRUE")


def push_run(run_dir: str | os.PathLike[str], repo_id: str, private: bool = True, token: str | None = None, *,
             commit_message: str | None = None, stage_dir: str | os.PathLike[str] | None = None) -> str:
    """Stage, check and upload a run to ``repo_id`` (created private unless ``private=False``); returns the commit
    URL. The token is ``token`` or huggingface_hub's (``HF_TOKEN`` / login cache)."""
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise OptBenchError(f"invalid --repo-id '{repo_id}': {exc}. Use 'user-or-org/model-name'.") from exc
    if "/" not in repo_id:
        raise OptBenchError(f"--repo-id '{repo_id}' names no owner: use 'user-or-org/{repo_id}'.")
    if _hub_offline():
        raise OptBenchError(
            "HF_HUB_OFFLINE is set, so nothing can be uploaded: unset it to push, or pass --dry-run to stage "
            "and check the upload folder only."
        )
    token = token or get_token()
    if not token:
        raise OptBenchError(
            "no Hugging Face token: set HF_TOKEN in the environment or run `hf auth login` (tokens are never "
            "taken on the command line), or pass --dry-run to stage and check only."
        )
    staged = stage_upload_folder(run_dir, stage_dir, repo_id=repo_id, token=token)
    summary = _read_summary(Path(run_dir))
    message = commit_message or (
        f"hf_optbench: {summary.get('optimizer', '?')} {summary.get('model_size', '?')}, "
        f"{summary.get('steps', '?')} steps")
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    info = api.upload_folder(repo_id=repo_id, folder_path=str(staged), commit_message=message,
                             repo_type="model", ignore_patterns=[_STAGE_MARKER])
    return str(getattr(info, "commit_url", info))


# ---------------------------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hf-optbench push",
        description="Upload a run (safetensors weights, config, tokenizer, benchmark model card) to the Hub. "
                    "The token comes from HF_TOKEN or `hf auth login`, never from the command line.",
    )
    p.add_argument("run_dir", help="the run's output_dir (holds summary.json)")
    p.add_argument("--repo-id", required=True, help="target repository, 'user-or-org/name'")
    p.add_argument("--public", action="store_true", help="create the repository public (default: private)")
    p.add_argument("--dry-run", action="store_true", help="stage and check the upload folder, upload nothing")
    p.add_argument("--stage-dir", default=None, help=f"where to stage (default RUN_DIR/{DEFAULT_STAGE_DIRNAME})")
    p.add_argument("--commit-message", default=None, help="commit message on the Hub")
    return p


def cli_main(argv: list[str] | None = None) -> int:
    """``hf-optbench push RUN_DIR --repo-id ID [--public] [--dry-run]``."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.dry_run:
        staged = stage_upload_folder(args.run_dir, args.stage_dir, repo_id=args.repo_id)
        names = sorted(p.name for p in staged.iterdir() if p.name != _STAGE_MARKER)
        print(f"staged {len(names)} files in {staged} (checks passed; nothing uploaded):")
        for name in names:
            print(f"  {name}")
        return 0
    url = push_run(args.run_dir, args.repo_id, private=not args.public, stage_dir=args.stage_dir,
                   commit_message=args.commit_message)
    print(f"uploaded to https://huggingface.co/{args.repo_id} ({'public' if args.public else 'private'}): {url}")
    return 0
