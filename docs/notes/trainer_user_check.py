"""What a Hugging Face Trainer user's files say, shown end to end (issue 39's "Must show"), on a CPU, offline:

1. the card of ``trainer.create_model_card()`` after a Lion run through ``trainer_optimizer`` (the README's Python
   API path), and the optimizer that the final ``training_args.bin`` names;
2. a TRL-style recipe (``recipes/trl_style_cpu.yaml``: ``optim: lion_32bit``, ``lr_scheduler_type: cosine``,
   ``num_train_epochs: 1``, only TrainingArguments' keys for them) run, and its summary.json;
3. the documented 2-process command (accelerate_configs/README.md, the ``cpu_ddp2.yaml`` row), the rerun line its
   config.yaml holds, a 1-process rerun of it (refused, naming both numbers), and the rerun line run.

    .venv/bin/python docs/notes/trainer_user_check.py [WORK_DIR]

Writes only under WORK_DIR (default: a new temporary directory, kept and named at the end), which links the
repository's recipes and accelerate configs; takes a few minutes on 2 cores (two 2-process runs). Everything it
prints comes from the files the runs wrote.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SUMMARY_KEYS = ("status", "optimizer", "optimizer_impl", "model_size", "learning_rate", "weight_decay", "schedule",
                "schedule_resolved", "max_steps", "steps", "tokens_per_step", "world_size", "final_train_loss",
                "final_eval_loss", "trainer_keys", "launch", "plan_hash")


def _section(title: str) -> None:
    print(f"\n{'=' * 100}\n{title}\n{'=' * 100}", flush=True)


def _shell(cmd: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``cmd`` (the venv's commands first on PATH), print it, its exit code and its last lines."""
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", HF_HUB_OFFLINE="1",
               OMP_NUM_THREADS="1", HF_OPTBENCH_CACHE=str(cwd / "cache"))
    print(f"$ {cmd}", flush=True)
    proc = subprocess.run(cmd, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    noise = ("Writing model shards", "kernels-community", "[transformers]")  # progress bars, optional kernels
    tail = [line for line in (proc.stdout + proc.stderr).splitlines()
            if line.strip() and not any(n in line for n in noise)][-5:]
    print("\n".join(f"  | {line}" for line in tail) + f"\n  exit {proc.returncode}", flush=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"failed: {cmd}")
    return proc


def _summary(run: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())
    print(json.dumps({k: summary.get(k) for k in SUMMARY_KEYS}, indent=1))


def api_card(work: Path) -> None:
    _section("1. trainer.create_model_card() after a Lion run through trainer_optimizer (Python API)")
    code = f"""
import torch
from transformers import Trainer, TrainingArguments, default_data_collator
from hf_optbench import (BenchArguments, DataArguments, attach_callbacks, build_model, default_callbacks,
                         prepare_data, schedule_training_args, trainer_optimizer)
block, batch, steps = 64, 8, 10
data = prepare_data(DataArguments(data_source="thai_sample", tokenizer_name="builtin:thai-bpe-2k",
                                  block_size=block), n_positions=block)
model = build_model("tiny", vocab_size=data.vocab_size, n_positions=block)
args = TrainingArguments("{work / 'api_lion'}", max_steps=steps, per_device_train_batch_size=batch,
                         eval_strategy="steps", eval_steps=5, logging_steps=1, logging_nan_inf_filter=False,
                         report_to="none", save_strategy="no", disable_tqdm=True, use_cpu=True,
                         **schedule_training_args("gpt3_cosine", num_training_steps=steps, warmup_steps=0.1))
trainer = Trainer(model=model, args=args, train_dataset=data.train, eval_dataset=data.eval,
                  processing_class=data.tokenizer, data_collator=default_data_collator,
                  optimizer_cls_and_kwargs=trainer_optimizer("lion", model_size="tiny"))
recorder, = default_callbacks(BenchArguments(), args.output_dir, tokens_per_step=batch * block)
attach_callbacks(trainer, [recorder])
trainer.train()
trainer.create_model_card()
trainer.save_model()
saved = torch.load(args.output_dir + "/training_args.bin", weights_only=False)
print("final training_args.bin:", saved.optim, saved.learning_rate, saved.weight_decay, saved.lr_scheduler_type.value,
      saved.warmup_steps)
print("the caller's TrainingArguments:", args.optim, args.learning_rate)
"""
    _shell(f"python -c {shlex.quote(code)}", work)
    card = (work / "api_lion" / "README.md").read_text(encoding="utf-8")
    print(card[card.index("### Training hyperparameters"):card.index("### Training results")])
    _summary(work / "api_lion")


def trl_recipe(work: Path) -> None:
    _section("2. a TRL-style recipe: optim lion_32bit, lr_scheduler_type cosine, num_train_epochs 1")
    print("\n".join(line for line in (ROOT / "recipes" / "trl_style_cpu.yaml").read_text().splitlines()
                    if not line.startswith("#")))
    _shell("hf-optbench run recipes/trl_style_cpu.yaml", work)
    _summary(work / "runs" / "trl_style_cpu")


def two_processes(work: Path) -> None:
    _section("3. the documented 2-process command, its config.yaml's rerun line, a 1-process rerun, the rerun")
    row = next(line for line in (ROOT / "accelerate_configs" / "README.md").read_text().splitlines()
               if line.startswith("| `cpu_ddp2.yaml` |"))
    command = row.split("|")[5].strip().strip("`")
    _shell(command, work)
    run = next((work / "runs").glob("accelerate_cpu_ddp2"))
    header = (run / "config.yaml").read_text().splitlines()[:3]
    print("config.yaml's header:\n" + "\n".join(header))
    rerun = header[1].lstrip("# ").strip().replace("NEW_DIR", "runs/accelerate_cpu_ddp2_rerun")
    _shell(f"hf-optbench run {run.relative_to(work)}/config.yaml --output_dir runs/one_process", work, check=False)
    _shell(rerun, work)
    for path in (run, work / "runs" / "accelerate_cpu_ddp2_rerun"):
        print(f"{path.relative_to(work)}:")
        _summary(path)


def main(argv: list[str]) -> int:
    work = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="trainer_user_check-"))
    work.mkdir(parents=True, exist_ok=True)
    for name in ("recipes", "accelerate_configs"):
        if not (work / name).exists():
            (work / name).symlink_to(ROOT / name)
    api_card(work)
    trl_recipe(work)
    two_processes(work)
    print(f"\nfiles: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
