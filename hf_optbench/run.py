"""One benchmark run: recipe -> GPT-2 from scratch -> Trainer with our optimizer and callbacks -> run directory.

    python -m hf_optbench.run recipes/quickstart_cpu.yaml --optimizer lion --max_steps 100
    accelerate launch --config_file accelerate_configs/t4x2_ddp.yaml -m hf_optbench.run recipes/lion_gpt2_large.yaml
    hf-optbench run recipes/quickstart_cpu.yaml

The optimizer and schedule are built here and handed to a stock ``transformers.Trainer`` through
``optimizers=(optimizer, scheduler)``: no Trainer subclass, so every Trainer feature (accumulation, mixed
precision, DDP/DeepSpeed through Accelerate, checkpoints, report_to) keeps working unchanged.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import RunConfig, parse_args
from .errors import OptBenchError

RUN_FILES = ("summary.json", "metrics.jsonl", "config.yaml", "trainer_state.json", "README.md")


@dataclass
class Prepared:
    """What a recipe resolves to before training: tools such as find-lr reuse it without a Trainer."""

    model: Any
    train_dataset: Any
    eval_dataset: Any
    data_collator: Any
    tokenizer: Any
    bundle: Any


def resolve_hyperparameters(cfg: RunConfig) -> dict[str, Any]:
    """Fill learning_rate / weight_decay / max_grad_norm the user did not set: tuned file first, else the
    optimizer registry's cited default for this model size. Returns {key: (value, source)} for the summary."""
    from .optimizers import is_dotted_path, lookup_tuned, optimizer_defaults

    if is_dotted_path(cfg.optim.optimizer):
        # No cited default exists for an arbitrary class: transformers' 5e-5 must not apply silently.
        if "learning_rate" not in cfg.explicit:
            raise OptBenchError(
                f"optimizer '{cfg.optim.optimizer}' is a dotted path with no cited default learning rate: set "
                "--learning_rate (e.g. find one with `hf-optbench find-lr RECIPE`)."
            )
        defaults: dict[str, Any] = {}
    else:
        defaults = optimizer_defaults(cfg.optim.optimizer, cfg.model.model_size)
    tuned = {}
    if cfg.optim.tuned_hparams_file:
        tuned = lookup_tuned(cfg.optim.tuned_hparams_file, cfg.optim.optimizer, cfg.model.model_size) or {}
    chosen: dict[str, Any] = {}
    for key in ("learning_rate", "weight_decay", "max_grad_norm"):
        if key in cfg.explicit:
            chosen[key] = {"value": getattr(cfg.training, key), "source": "user"}
        elif key in tuned:
            setattr(cfg.training, key, tuned[key])
            chosen[key] = {"value": tuned[key], "source": f"tuned: {cfg.optim.tuned_hparams_file}"}
        elif key in defaults:
            setattr(cfg.training, key, defaults[key])
            chosen[key] = {"value": defaults[key], "source": defaults.get("source", "registry default")}
        else:
            chosen[key] = {"value": getattr(cfg.training, key), "source": "transformers default"}
    return chosen


def prepare(cfg: RunConfig) -> Prepared:
    """Tokenizer + packed datasets + a freshly initialised model, all from the recipe."""
    from transformers import default_data_collator, set_seed

    from .data import check_model_vocab, prepare_data
    from .models import build_model

    n_positions = cfg.model.n_positions or cfg.data.block_size
    # Rank 0 tokenizes and caches first; the other ranks then load the memory-mapped cache (run_clm's pattern).
    with cfg.training.main_process_first(desc="tokenize and pack"):
        bundle = prepare_data(cfg.data, n_positions=n_positions)
    set_seed(cfg.training.seed)  # the init depends only on the seed, not on what data loading consumed
    model = build_model(
        cfg.model.model_size,
        bundle.vocab_size,
        n_positions=n_positions,
        bos_token_id=bundle.bos_token_id,
        eos_token_id=bundle.eos_token_id,
        pad_token_id=bundle.pad_token_id,
        attn_implementation=cfg.model.attn_implementation,
        pad_vocab_to_multiple_of=cfg.model.pad_vocab_to_multiple_of,
        init_from=cfg.model.init_from,
        dropout=cfg.model.dropout,
    )
    check_model_vocab(bundle, model.config.vocab_size)
    return Prepared(model, bundle.train, bundle.eval, default_data_collator, bundle.tokenizer, bundle)


def git_state(path: Path | None = None) -> dict[str, Any]:
    """Commit of the code that ran and whether its tree had uncommitted changes (None outside git)."""
    where = path or Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True,
                                timeout=10)
        if commit.returncode != 0:
            return {"commit": None, "dirty": None}
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                                capture_output=True, text=True, timeout=10)
        return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def environment() -> dict[str, Any]:
    """Versions and devices a reader needs to reproduce the figures."""
    from importlib import metadata

    import torch

    versions = {}
    for pkg in ("hf_optbench", "torch", "transformers", "accelerate", "datasets", "tokenizers", "evaluate",
                "bitsandbytes", "lion-pytorch", "schedulefree", "pytorch-optimizer", "deepspeed", "wandb"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": versions,
        "torch_cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({platform.processor() or platform.machine()})",
        "device_count": torch.cuda.device_count() if cuda else 1,
        "cpu_threads": torch.get_num_threads(),
        # glibc malloc settings move CPU step times by ~25% (README, benchmark 1), so a run records them
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
    }


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _write_config(cfg: RunConfig, out: Path, hparams: dict[str, Any]) -> None:
    import yaml

    from .hub import scrub_secrets

    resolved = scrub_secrets(cfg.to_dict())
    resolved["_hyperparameter_sources"] = {k: v["source"] for k, v in hparams.items()}
    (out / "config.yaml").write_text(
        "# Resolved configuration of this run (recipe + CLI + defaults); secrets removed.\n"
        + yaml.safe_dump(json.loads(json.dumps(resolved, default=str)), sort_keys=True),
        encoding="utf-8",
    )


def resolve_resume_checkpoint(out: Path, move_incomplete: bool = True) -> str:
    """``--resume_from_checkpoint true`` -> the newest *complete* checkpoint in ``out``.

    transformers' get_last_checkpoint takes the highest-numbered folder even when a SIGKILL tore it mid-save
    (resume then fails on a truncated safetensors header). A checkpoint is complete once trainer_state.json, written
    last, is there; incomplete ones are moved aside (``*.incomplete``), never deleted.
    """
    import re

    ckpts = sorted((p for p in out.glob("checkpoint-*") if re.fullmatch(r"checkpoint-\d+", p.name)),
                   key=lambda p: int(p.name.split("-")[1]))
    complete = [p for p in ckpts if (p / "trainer_state.json").is_file()]
    if not complete:
        raise OptBenchError(
            f"--resume_from_checkpoint true but '{out}' holds no complete checkpoint-* folder: start without it "
            "(with --overwrite_output_dir true if the folder has other results), or pass a checkpoint path."
        )
    if move_incomplete:
        for p in ckpts:
            if p not in complete and int(p.name.split("-")[1]) > int(complete[-1].name.split("-")[1]):
                p.rename(p.with_name(p.name + ".incomplete"))
    return str(complete[-1])


def _clear_previous(out: Path) -> None:
    """--overwrite_output_dir: remove what a previous run wrote (only hf_optbench/Trainer outputs)."""
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for child in out.glob("checkpoint-*"):
        shutil.rmtree(child, ignore_errors=True)


def _check_eval_split(cfg: RunConfig, prepared: Prepared) -> None:
    """With dataloader_drop_last (kept so that every train step sees the same number of tokens) the eval loader
    also drops its partial batch: an eval split smaller than one eval batch would silently evaluate nothing."""
    args = cfg.training
    n_eval = len(prepared.eval_dataset) if prepared.eval_dataset is not None else 0
    per_eval_step = args.per_device_eval_batch_size * args.world_size
    if args.eval_strategy != "no" and args.dataloader_drop_last and n_eval < per_eval_step:
        raise OptBenchError(
            f"the validation split holds {n_eval} blocks of {cfg.data.block_size} tokens, fewer than one eval batch "
            f"(per_device_eval_batch_size {args.per_device_eval_batch_size} x {args.world_size} processes): "
            "evaluation would see nothing. Lower per_device_eval_batch_size, enlarge the validation split, or use "
            "more data."
        )


class ConsoleProgress:
    """A line every ~10% of the run and at each evaluation, instead of transformers' dict per logged step
    (logging_steps=1 would otherwise print every step)."""

    def __new__(cls, max_steps: int):  # built lazily: transformers is imported inside functions only
        from transformers import TrainerCallback

        class _ConsoleProgress(TrainerCallback):
            def __init__(self) -> None:
                self.every = max(1, max_steps // 10)

            def on_log(self, args, state, control, logs=None, **kwargs):
                if not state.is_world_process_zero or not logs:
                    return
                if "eval_loss" in logs:
                    print(f"[step {state.global_step}/{state.max_steps}] eval_loss {logs['eval_loss']:.4f}",
                          flush=True)
                elif "loss" in logs and (state.global_step % self.every == 0 or state.global_step == 1):
                    grad = logs.get("grad_norm")
                    grad_s = f" grad_norm {grad:.3g}" if isinstance(grad, (int, float)) else ""
                    print(f"[step {state.global_step}/{state.max_steps}] loss {logs['loss']:.4f} "
                          f"lr {logs.get('learning_rate', 0):.3g}{grad_s}", flush=True)

        return _ConsoleProgress()


def _last_log(log_history: list[dict[str, Any]], key: str) -> float | None:
    for row in reversed(log_history):
        if key in row:
            return row[key]
    return None


def train(cfg: RunConfig) -> dict[str, Any]:
    """Run one benchmark run and return its summary (also written to ``output_dir/summary.json``)."""
    import torch

    from .callbacks import default_callbacks
    from .metrics import flops_per_token
    from .models import count_parameters
    from .optimizers import build_optimizer, describe_optimizer, is_schedule_free, optimizer_callbacks
    from .schedules import build_scheduler, describe_scheduler
    from .trainer import OptBenchTrainer

    args = cfg.training
    out = Path(args.output_dir)
    git = git_state()
    if cfg.run.require_clean_git and git["dirty"]:
        raise OptBenchError(
            "require_clean_git is set and the hf_optbench source tree has uncommitted changes: commit them, "
            "or drop --require_clean_git."
        )
    hparams = resolve_hyperparameters(cfg)
    resume = args.resume_from_checkpoint
    if isinstance(resume, str) and resume.lower() in ("true", "false"):
        resume = resume.lower() == "true"
    if resume is True:
        resume = resolve_resume_checkpoint(out, move_incomplete=args.process_index == 0)

    if is_schedule_free(cfg.optim.optimizer) and "schedule" in cfg.explicit and cfg.optim.schedule != "none":
        raise OptBenchError(
            f"optimizer '{cfg.optim.optimizer}' is schedule-free (its warmup is inside the optimizer), but schedule "
            f"'{cfg.optim.schedule}' was set: drop the schedule key or set it to none."
        )
    prepared = prepare(cfg)
    _check_eval_split(cfg, prepared)
    model = prepared.model
    optimizer = build_optimizer(
        cfg.optim.optimizer,
        model,
        lr=args.learning_rate,
        weight_decay=args.weight_decay,
        model_size=cfg.model.model_size,
        embedding_state_32bit=cfg.optim.embedding_state_32bit,
        **cfg.optim.kwargs(),
    )
    schedule_free = is_schedule_free(optimizer)
    schedule = "none" if schedule_free else cfg.optim.schedule
    scheduler = build_scheduler(
        schedule,
        optimizer,
        num_training_steps=args.max_steps,
        warmup_steps=args.warmup_steps,
        min_lr_ratio=cfg.optim.min_lr_ratio,
        **cfg.optim.schedule_kwargs_dict(),
    )

    world_size = args.world_size
    tokens_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * world_size \
        * cfg.data.block_size
    fpt = flops_per_token(model.config, seq_len=cfg.data.block_size)
    callbacks = default_callbacks(cfg.bench, str(out), tokens_per_step=tokens_per_step, flops_per_token=fpt,
                                  resume=bool(resume))
    callbacks += optimizer_callbacks(optimizer)  # schedule-free train/eval switch, Sophia's Hessian estimate
    recorder = next(c for c in callbacks if hasattr(c, "summary"))
    callbacks.append(ConsoleProgress(args.max_steps))

    is_main = args.process_index == 0
    if is_main:
        out.mkdir(parents=True, exist_ok=True)
        if cfg.run.overwrite_output_dir and not resume:
            _clear_previous(out)
        _write_config(cfg, out, hparams)

    trainer = OptBenchTrainer(
        model=model,
        args=args,
        train_dataset=prepared.train_dataset,
        eval_dataset=prepared.eval_dataset,
        data_collator=prepared.data_collator,
        processing_class=prepared.tokenizer,
        optimizers=(optimizer, scheduler),
        callbacks=callbacks,
    )
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)  # replaced by ConsoleProgress
    trainer.remove_callback(ProgressCallback)

    summary: dict[str, Any] = {
        "optimizer": cfg.optim.optimizer,
        "optimizer_impl": describe_optimizer(optimizer),  # re-read after training: what actually stepped
        "model_size": cfg.model.model_size,
        "num_params": count_parameters(model),
        "num_params_non_embedding": count_parameters(model, exclude_embeddings=True),
        "vocab_size": prepared.bundle.vocab_size,
        "embedding_rows": model.get_input_embeddings().num_embeddings,
        "block_size": cfg.data.block_size,
        "micro_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "world_size": world_size,
        "tokens_per_step": tokens_per_step,
        "seed": args.seed,
        "learning_rate": args.learning_rate,
        "weight_decay": args.weight_decay,
        "max_grad_norm": args.max_grad_norm,
        "hyperparameter_sources": {k: v["source"] for k, v in hparams.items()},
        "schedule": schedule,
        "schedule_resolved": describe_scheduler(scheduler),
        "schedule_kwargs": {"warmup_steps": args.warmup_steps, "min_lr_ratio": cfg.optim.min_lr_ratio,
                            **cfg.optim.schedule_kwargs_dict()},
        "embedding_state_32bit": cfg.optim.embedding_state_32bit,
        "precision": "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
        "max_steps": args.max_steps,
        "data": prepared.bundle.info,
        "env": environment(),
        "git": git,
        "recipe": cfg.recipe_path,
        "status": "failed",
        "error": None,
    }
    started = time.time()
    try:
        result = trainer.train(resume_from_checkpoint=resume or None)
        summary["train_runtime_s"] = result.metrics.get("train_runtime")
        status = recorder.status
        last_eval_step = next((row.get("step") for row in reversed(trainer.state.log_history)
                               if "eval_loss" in row), None)
        has_eval = prepared.eval_dataset is not None and len(prepared.eval_dataset) > 0
        if status != "diverged" and has_eval and last_eval_step != trainer.state.global_step:
            trainer.evaluate()  # the final eval loss is always measured at the last step
        summary["status"] = status
        trainer.save_state()
    except Exception as exc:  # recorded, then re-raised: the run's measurements so far are kept on disk
        summary["status"] = "oom" if "out of memory" in str(exc).lower() else "failed"
        summary["error"] = f"{type(exc).__name__}: {exc}"
        summary["traceback"] = traceback.format_exc(limit=20)
        summary["train_runtime_s"] = time.time() - started
        raise
    finally:
        state = trainer.state
        summary["steps"] = state.global_step
        summary["tokens_seen"] = state.global_step * tokens_per_step
        summary["final_train_loss"] = _last_log(state.log_history, "loss")
        summary["final_eval_loss"] = _last_log(state.log_history, "eval_loss")
        summary.update(recorder.summary())
        used = trainer.optimizer if trainer.optimizer is not None else optimizer
        summary["optimizer_impl"] = describe_optimizer(used)
        if recorder.status == "diverged":
            summary["status"] = "diverged"
        if is_main:
            write_json_atomic(out / "summary.json", summary)
    if is_main and cfg.run.write_model_card:
        from .hub import write_model_card

        write_model_card(out)
    if args.push_to_hub and is_main:
        # Our own upload (weights, config, tokenizer, benchmark model card; never training_args.bin, which pickles
        # the arguments) rather than trainer.push_to_hub(), which would replace the card with a generic one.
        from .hub import push_run

        push_run(out, args.hub_model_id or out.name, private=args.hub_private_repo is not False)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # Without this, 2 of 11 CPU runs aborted with SIGABRT at exit (STACK-FACTS, distributed on CPU).
        torch.distributed.destroy_process_group()
    return summary


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python -m hf_optbench.run`` and ``accelerate launch -m hf_optbench.run``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        from .config import make_help_parser

        make_help_parser().print_help()
        return 0
    try:
        cfg = parse_args(argv)
        summary = train(cfg)
    except OptBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps({k: summary.get(k) for k in ("status", "optimizer", "model_size", "num_params", "steps",
                                                  "final_train_loss", "final_eval_loss",
                                                  "optimizer_state_bytes", "train_runtime_s")}))
    return 0 if summary["status"] in ("completed", "diverged") else 1


def exit_process(code: int) -> None:
    """End the process with ``code``; in a multi-process run, without interpreter finalization.

    Why: Gloo's worker threads can still hold work objects when the interpreter is torn down, and their destruction
    then aborts the process (SIGABRT, "terminate called without an active exception") after all results were
    written, even after destroy_process_group() (seen here in CI; pytorch/pytorch PR #179291 describes the cause
    and was abandoned upstream). Everything is already flushed to disk at this point; W&B is finished explicitly
    because its own atexit hook would be skipped.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        wandb = sys.modules.get("wandb")
        if wandb is not None and getattr(wandb, "run", None) is not None:
            wandb.finish()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    exit_process(main())
