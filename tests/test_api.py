"""The Python API in a stock ``transformers.Trainer`` (hf_optbench/trainer.py, no subclass): the README's example run
verbatim, every registry optimizer through ``optimizer_cls_and_kwargs``, schedules through TrainingArguments, and
the same under two-process CPU DeepSpeed ZeRO-2."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from transformers import Trainer, TrainingArguments, default_data_collator
from transformers.optimization import get_scheduler

import hf_optbench
from hf_optbench.errors import OptBenchError
from hf_optbench.optim.registry import OPTIMIZERS, build_optimizer, optimizer_callbacks, spec_of
from hf_optbench.optim.schedules import build_scheduler
from hf_optbench.optim.unwrap import innermost_optimizer
from hf_optbench.run.trainer import OptimizerFactory, schedule_training_args, trainer_optimizer

from fixtures.launch import run_launch
from fixtures.models import tiny_model, token_data

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
API_SECTION = "## The Python API, in any `transformers.Trainer`"
SEQ, BATCH = 32, 4


def readme_api_block() -> str:
    """The first ```python block of the README's Python API section, as written."""
    text = README.read_text(encoding="utf-8")
    assert API_SECTION in text, f"README section {API_SECTION!r} is missing"
    section = text.split(API_SECTION, 1)[1]
    match = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert match, "no python block in the README's Python API section"
    return match.group(1)




def args_for(out: Path, steps: int, **schedule: object) -> TrainingArguments:
    return TrainingArguments(str(out), max_steps=steps, per_device_train_batch_size=BATCH, use_cpu=True,
                             report_to="none", logging_steps=1, logging_nan_inf_filter=False, save_strategy="no",
                             disable_tqdm=True, seed=0, **schedule)


def test_readme_api_example_runs_verbatim(tmp_path, monkeypatch) -> None:
    """The README block, exec'd as written (so README and code cannot drift), trains Lion with the GPT-3 cosine in
    a stock Trainer, records metrics.jsonl with eval accuracy, and raises no placement warning."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_OPTBENCH_CACHE", str(tmp_path / "cache"))
    namespace: dict[str, object] = {"__name__": "readme_example"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(readme_api_block(), "README.md", "exec"), namespace)  # noqa: S102 - the test's purpose
    assert not [w for w in caught if "OptBenchRecorder" in str(w.message)], [str(w.message) for w in caught]

    trainer, recorder, args = namespace["trainer"], namespace["recorder"], namespace["args"]
    assert type(trainer) is Trainer
    inner = innermost_optimizer(trainer.optimizer)
    assert type(inner).__module__.startswith("lion_pytorch") and spec_of(inner).name == "lion"
    assert not [k for k in vars(inner) if k.startswith("hf_optbench")]  # nothing stamped on the optimizer
    assert recorder.status == "completed"
    out = Path(args.output_dir)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = args.max_steps
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, steps + 1))
    evals = [r for r in rows if r["kind"] == "eval"]
    assert evals and all(0.0 <= r["eval_accuracy"] <= 1.0 for r in evals)
    n_params = sum(p.numel() for p in trainer.model.parameters())
    memory = [r for r in rows if r["kind"] == "memory"]
    assert memory and memory[0]["optimizer_state_bytes"] == 4 * n_params  # Lion: one fp32 moment per parameter

    # the schedule that ran is hf_optbench's gpt3_cosine, step for step
    reference = build_optimizer("lion", tiny_model(), model_size="tiny")
    peak = reference.param_groups[0]["lr"]  # the cited default, before the schedule scales it
    expected = build_scheduler("gpt3_cosine", reference, num_training_steps=steps, warmup_steps=0.1)
    ran = [row["learning_rate"] for row in trainer.state.log_history if "loss" in row and "learning_rate" in row]
    want = []
    for _ in range(steps):
        want.append(expected.get_last_lr()[0])
        expected.step()
    assert ran == pytest.approx(want, rel=1e-9, abs=1e-12) and max(ran) == pytest.approx(peak)


@pytest.mark.parametrize("name", [n for n, s in OPTIMIZERS.items() if not s.requires_cuda])
def test_stock_trainer_runs_every_cpu_optimizer(name: str, tmp_path) -> None:
    pytest.importorskip(OPTIMIZERS[name].package.split(".")[0].replace("-", "_"))
    model = tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    schedule = "none" if OPTIMIZERS[name].schedule_free else "gpt3_cosine"
    steps = 3
    trainer = Trainer(model=model, args=args_for(tmp_path, steps, **schedule_training_args(
                          schedule, num_training_steps=steps)),
                      train_dataset=token_data(BATCH * steps), data_collator=default_data_collator,
                      optimizer_cls_and_kwargs=trainer_optimizer(name, model_size="tiny"))
    for callback in optimizer_callbacks(build_optimizer(name, tiny_model(), model_size="tiny")):
        trainer.add_callback(callback)  # schedule-free's train/eval switch, Sophia's Hessian estimate
    trainer.train()
    assert spec_of(trainer.optimizer).name == name
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)), "nothing trained"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", [n for n, s in OPTIMIZERS.items() if s.requires_cuda])
def test_stock_trainer_runs_every_cuda_optimizer(name: str, tmp_path) -> None:
    pytest.importorskip("bitsandbytes")
    model = tiny_model().cuda()
    args = TrainingArguments(str(tmp_path), max_steps=3, per_device_train_batch_size=BATCH, report_to="none",
                             logging_steps=1, save_strategy="no", disable_tqdm=True,
                             **schedule_training_args("gpt3_cosine", num_training_steps=3))
    trainer = Trainer(model=model, args=args, train_dataset=token_data(BATCH * 3),
                      data_collator=default_data_collator,
                      optimizer_cls_and_kwargs=trainer_optimizer(name, model_size="tiny"))
    trainer.train()
    assert spec_of(trainer.optimizer).name == name


@pytest.mark.parametrize("name, kwargs", [
    ("gpt3_cosine", {"warmup_steps": 0.1}),
    ("gpt3_cosine", {"warmup_steps": 3, "min_lr_ratio": 0.0, "num_cycles": 0.25}),
    ("wsd", {"warmup_steps": 2, "decay_ratio": 0.3, "decay_type": "cosine"}),
    ("constant_with_warmup", {"warmup_steps": 4}),
    ("constant", {}),
])
def test_trainer_built_schedule_equals_build_scheduler(name: str, kwargs: dict) -> None:
    """What Trainer.create_scheduler builds from schedule_training_args (and what DeepSpeed rebuilds) is
    hf_optbench's schedule, learning rate for learning rate."""
    steps = 20
    ours = build_scheduler(name, torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5),
                           num_training_steps=steps, **kwargs)
    fields = schedule_training_args(name, num_training_steps=steps, **kwargs)
    args = TrainingArguments("unused", max_steps=steps, report_to="none", **fields)
    theirs = get_scheduler(args.lr_scheduler_type, torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5),
                           num_warmup_steps=args.get_warmup_steps(steps), num_training_steps=steps,
                           scheduler_specific_kwargs=args.lr_scheduler_kwargs)
    for _ in range(steps):
        assert theirs.get_last_lr() == pytest.approx(ours.get_last_lr(), rel=1e-12, abs=1e-15)
        ours.step()
        theirs.step()


def test_one_cycle_has_no_transformers_type_and_says_what_to_do() -> None:
    with pytest.raises(OptBenchError, match="optimizers=\\(None, scheduler\\)"):
        schedule_training_args("one_cycle", num_training_steps=10)


def test_the_factory_hands_back_the_built_optimizer_and_stamps_nothing(tmp_path) -> None:
    """trainer_optimizer(opt): the Trainer gets the very optimizer built over its model, with no attribute added
    (what ran is read from the object at train begin, hf_optbench.optim.held)."""
    model = tiny_model()
    opt = build_optimizer("lion", model, model_size="tiny")
    factory, kwargs = trainer_optimizer(opt)
    assert factory()(model, **kwargs) is opt
    assert not [k for k in vars(opt) if k.startswith("hf_optbench")]


def test_factory_refuses_a_built_optimizer_over_other_parameters() -> None:
    opt = build_optimizer("lion", tiny_model(), model_size="tiny")
    factory, kwargs = trainer_optimizer(opt)
    with pytest.raises(OptBenchError, match="by name"):
        factory()(tiny_model(seed=1), **kwargs)
    with pytest.raises(OptBenchError, match="takes no build arguments"):
        OptimizerFactory()(tiny_model(), optimizer=opt, lr=1e-3)


_ZERO2_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, default_data_collator
    from hf_optbench.optim.registry import spec_of
    from hf_optbench.optim.unwrap import optimizer_chain
    from hf_optbench.run.trainer import schedule_training_args, trainer_optimizer

    out, steps = sys.argv[1], 6
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=64,
                                       use_cache=False, bos_token_id=0, eos_token_id=0))
    ids = torch.randint(0, 128, (64, 32), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": r, "labels": r} for r in ids]
    args = TrainingArguments(out, max_steps=steps, per_device_train_batch_size=2, report_to="none", use_cpu=True,
                             logging_steps=1, save_strategy="no", disable_tqdm=True,
                             **schedule_training_args("gpt3_cosine", num_training_steps=steps, warmup_steps=2))
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator,
                      optimizer_cls_and_kwargs=trainer_optimizer("lion", model_size="tiny"))
    trainer.train()
    chain = optimizer_chain(trainer.optimizer)
    if args.process_index == 0:
        inner = chain[-1]
        json.dump({"deepspeed": trainer.is_deepspeed_enabled, "world_size": args.world_size,
                   "chain": [type(o).__module__ + "." + type(o).__name__ for o in chain],
                   "name": spec_of(inner).name,
                   "state_names": sorted({k for s in inner.state.values() for k in s}),
                   "lrs": [r["learning_rate"] for r in trainer.state.log_history if "loss" in r]},
                  open(os.path.join(out, "rank0.json"), "w"))
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter finalization: Gloo threads can abort it (see hf_optbench.run.exit_process)
    """
)


@pytest.mark.slow
@pytest.mark.distributed
def test_stock_trainer_keeps_lion_and_cosine_under_cpu_zero2(tmp_path) -> None:
    pytest.importorskip("deepspeed")
    script = tmp_path / "zero2_stock.py"
    script.write_text(_ZERO2_SCRIPT)
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    cmd = [accelerate, "launch", "--config_file", str(ROOT / "accelerate_configs" / "cpu_zero2.yaml"), str(script),
           str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    run_launch(cmd, env=env, timeout=400, what="ZeRO-2 run", cwd=str(ROOT), tail=5000)
    got = json.loads((tmp_path / "rank0.json").read_text())
    assert got["deepspeed"] and got["world_size"] == 2
    assert got["name"] == "lion" and got["chain"][-1] == "lion_pytorch.lion_pytorch.Lion", got["chain"]
    assert any("deepspeed" in c for c in got["chain"]), got["chain"]
    assert got["state_names"] == ["exp_avg"]  # Lion's one moment, not AdamW's two
    reference = build_optimizer("lion", tiny_model(), model_size="tiny")
    expected = build_scheduler("gpt3_cosine", reference, num_training_steps=6, warmup_steps=2)
    want = []
    for _ in range(6):
        want.append(expected.get_last_lr()[0])
        expected.step()
    assert got["lrs"] == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_public_names_resolve() -> None:
    for name in hf_optbench.__all__:
        assert getattr(hf_optbench, name) is not None, name
