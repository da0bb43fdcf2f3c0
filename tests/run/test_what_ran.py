"""What is recorded is what ran: the record of every CPU optimizer equals its param_groups after a step; a default
AdamW run's config.yaml, summary.json and TensorBoard all say the beta2 it used (0.99, not transformers' 0.999);
the same holds in a stock Trainer built through the Python API; config.yaml reruns the run to the same loss; the
final model loads from the run directory."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch
import yaml

from hf_optbench.optim.registry import OPTIMIZERS, build_optimizer, is_schedule_free
from hf_optbench.optim.schedules import build_scheduler
from hf_optbench.optim.unwrap import innermost_optimizer
from hf_optbench.run import train as run_mod
from hf_optbench.run.what_ran import training_args_fields, what_ran

from fixtures.models import tiny_model, token_data

ROOT = Path(__file__).resolve().parents[2]
QUICK = str(ROOT / "recipes" / "quickstart_cpu.yaml")
SMALL = ["--max_steps", "3", "--eval_steps", "3", "--per_device_train_batch_size", "4", "--block_size", "32",
         "--timing_warmup_steps", "1", "--save_strategy", "no"]
CPU_OPTIMIZERS = [name for name, spec in OPTIMIZERS.items() if not spec.requires_cuda]


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize("name", CPU_OPTIMIZERS)
def test_record_equals_the_param_groups_after_the_first_step(name: str) -> None:
    model = tiny_model()
    opt = build_optimizer(name, model, model_size="tiny")
    sched = build_scheduler("none" if is_schedule_free(opt) else "gpt3_cosine", opt, num_training_steps=4,
                            warmup_steps=1)
    record = what_ran(opt, sched, hparams={"max_grad_norm": {"value": 1.0, "source": "user"}})
    if hasattr(opt, "train"):
        opt.train()  # schedule-free: step in train mode
    batch = token_data(2)
    loss = model(input_ids=torch.stack([b["input_ids"] for b in batch]),
                 labels=torch.stack([b["labels"] for b in batch])).loss
    loss.backward()
    opt.step()
    sched.step()

    groups = innermost_optimizer(opt).param_groups
    for recorded, group in zip(record["param_groups"], groups, strict=True):
        for key, value in recorded.items():
            if key == "tensors":
                assert value == len(group["params"])
            elif key == "lr":  # the rate the group was built with; the schedule scales it per step
                assert value == group.get("initial_lr", group["lr"]), (name, key)
            else:
                assert _plain(value) == _plain(group[key]), (name, key, value, group[key])
    hp = {k: v["value"] for k, v in record["hyperparameters"].items()}
    assert hp["weight_decay"] == max(g["weight_decay"] for g in groups)  # not torch's optimizer.defaults
    assert hp["learning_rate"] in {g.get("initial_lr", g["lr"]) for g in groups}
    assert hp["max_grad_norm"] == 1.0 and record["hyperparameters"]["max_grad_norm"]["source"] == "user"
    fields = training_args_fields(record)
    assert fields["optim"] == f"hf_optbench:{name}"
    betas = {tuple(g["betas"]) for g in groups if isinstance(g.get("betas"), (tuple, list))}
    if "adam_beta2" in fields:
        assert (fields["adam_beta1"], fields["adam_beta2"]) in betas
    else:
        assert not any(len(b) == 2 for b in betas)


@pytest.fixture(scope="module")
def adamw_run(tmp_path_factory) -> Path:
    """The default AdamW quickstart, 3 steps, reporting to TensorBoard."""
    pytest.importorskip("tensorboard")
    out = tmp_path_factory.mktemp("adamw") / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        assert run_mod.main([QUICK, "--output_dir", str(out), "--report_to", "tensorboard", *SMALL]) == 0
    return out


def _tensorboard(out: Path) -> tuple[dict, dict, dict]:
    """(the args text, the HParams session's values, the hf_optbench text section) of a run directory."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    (events,) = {p.parent for p in out.glob("runs/**/events.out.tfevents.*")}
    acc = EventAccumulator(str(events), size_guidance={"tensors": 0})
    acc.Reload()
    args = json.loads(acc.Tensors("args/text_summary")[0].tensor_proto.string_val[0].decode())
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = {k: v.string_value or v.number_value for k, v in start.session_start_info.hparams.items()}
    text = acc.Tensors("hf_optbench/text_summary")[0].tensor_proto.string_val[0].decode()
    return args, hparams, json.loads(text.split("```json\n", 1)[1].rsplit("```", 1)[0])


@pytest.mark.slow
def test_default_adamw_run_records_the_beta2_it_ran_everywhere(adamw_run: Path) -> None:
    config = yaml.safe_load((adamw_run / "config.yaml").read_text())
    assert (config["adam_beta1"], config["adam_beta2"]) == (0.9, 0.99)  # AdamW's cited value, not 0.999
    assert "optim" not in config and "lr_scheduler_type" not in config  # replaced: optimizer / schedule say it
    assert config["optimizer"] == "adamw" and config["schedule"] == "gpt3_cosine"
    summary = json.loads((adamw_run / "summary.json").read_text())
    assert summary["hyperparameters"]["betas"]["value"] == [0.9, 0.99]
    assert "nanoGPT" in summary["hyperparameters"]["betas"]["source"]
    assert [g["weight_decay"] for g in summary["param_groups"]] == [0.1, 0.0]
    args, hparams, _ = _tensorboard(adamw_run)
    assert (args["adam_beta2"], args["weight_decay"], args["optim"]) == (0.99, 0.1, "hf_optbench:adamw")
    assert args["lr_scheduler_type"] == "cosine_with_min_lr"
    assert hparams["hf_optbench/hyperparameters/betas/value"] == "[0.9, 0.99]"
    assert hparams["hf_optbench/hyperparameters/weight_decay/value"] == pytest.approx(0.1)


@pytest.mark.slow
def test_a_stock_trainer_built_through_the_api_records_what_ran(tmp_path: Path) -> None:
    """The README's Python API path (trainer_optimizer + attach_callbacks) with report_to tensorboard: the args
    TensorBoard records and its hf_optbench section say Lion at its cited 3.33e-4 and 0.3, not transformers'
    adamw_torch_fused at 5e-05 and 0.0."""
    pytest.importorskip("tensorboard")
    from transformers import Trainer, TrainingArguments, default_data_collator

    from hf_optbench.config.bench_args import BenchArguments
    from hf_optbench.measure.recorder import attach_callbacks, default_callbacks
    from hf_optbench.run.trainer import schedule_training_args, trainer_optimizer

    out = tmp_path / "api"
    args = TrainingArguments(str(out), max_steps=2, per_device_train_batch_size=4, use_cpu=True, logging_steps=1,
                             logging_nan_inf_filter=False, save_strategy="no", report_to="tensorboard",
                             disable_tqdm=True, **schedule_training_args("gpt3_cosine", num_training_steps=2))
    trainer = Trainer(model=tiny_model(), args=args, train_dataset=token_data(16), data_collator=default_data_collator,
                      optimizer_cls_and_kwargs=trainer_optimizer("lion", model_size="tiny"))
    recorder, = default_callbacks(BenchArguments(), str(out), tokens_per_step=4 * 32)
    attach_callbacks(trainer, [recorder])
    trainer.train()
    recorded, hparams, section = _tensorboard(out)
    assert recorded["optim"] == "hf_optbench:lion"
    assert (recorded["learning_rate"], recorded["weight_decay"]) == (3.33e-4, 0.3)
    assert (recorded["adam_beta1"], recorded["adam_beta2"]) == (0.9, 0.99)
    assert hparams["hf_optbench/optimizer"] == "lion"
    assert hparams["hf_optbench/hyperparameters/weight_decay/value"] == pytest.approx(0.3)
    sources = {k: v["source"] for k, v in section["hyperparameters"].items()}
    assert "Chen et al. 2023" in sources["weight_decay"] and "Chen et al. 2023" in sources["learning_rate"]


@pytest.mark.slow
def test_config_yaml_reruns_the_run_to_the_same_loss(adamw_run: Path, tmp_path: Path) -> None:
    from hf_optbench.cli import main as cli_main

    again = tmp_path / "again"
    with contextlib.redirect_stdout(io.StringIO()):  # `hf-optbench run RUN_DIR/config.yaml --output_dir NEW`
        assert cli_main(["run", str(adamw_run / "config.yaml"), "--output_dir", str(again)]) == 0
    first, second = (json.loads((d / "summary.json").read_text()) for d in (adamw_run, again))
    assert second["steps"] == first["steps"] == 3
    assert second["final_train_loss"] == first["final_train_loss"]
    assert second["final_eval_loss"] == first["final_eval_loss"]
    assert second["hyperparameters"]["betas"]["value"] == [0.9, 0.99]
    configs = [yaml.safe_load((d / "config.yaml").read_text()) for d in (adamw_run, again)]
    assert {k: v for k, v in configs[0].items() if k != "output_dir"} == \
        {k: v for k, v in configs[1].items() if k != "output_dir"}


@pytest.mark.slow
def test_config_option_reads_the_run_config(adamw_run: Path, capsys) -> None:
    """``--config RUN_DIR/config.yaml`` reads the file as the recipe: its output_dir, a finished run, is refused
    before any work unless another is given."""
    assert run_mod.main(["--config", str(adamw_run / "config.yaml")]) == 2
    assert f"output_dir '{adamw_run}' already holds a finished run" in capsys.readouterr().err


@pytest.mark.slow
def test_the_final_model_loads_from_the_run_directory(adamw_run: Path) -> None:
    from transformers import AutoTokenizer, GPT2LMHeadModel

    from hf_optbench.publish.stage import find_weights_dir

    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
        assert (adamw_run / name).is_file(), name
    model = GPT2LMHeadModel.from_pretrained(adamw_run)
    tokenizer = AutoTokenizer.from_pretrained(adamw_run)
    assert model.config.n_positions == 32 and len(tokenizer) <= model.config.vocab_size
    assert find_weights_dir(adamw_run) == adamw_run  # push stages the final model, not a checkpoint


@pytest.mark.slow
def test_save_final_model_false_keeps_the_run_directory_without_weights(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        assert run_mod.main([QUICK, "--output_dir", str(out), *SMALL, "--max_steps", "1",
                             "--save_final_model", "false"]) == 0
    assert not (out / "model.safetensors").exists() and (out / "summary.json").is_file()


@pytest.mark.slow
def test_each_step_of_a_run_happens_once(tmp_path: Path, monkeypatch) -> None:
    """One writer of summary.json (the run, not also the recorder), one resolution of the hyperparameters, one
    lock of output_dir, one check of the Hub upload."""
    from hf_optbench.measure import recorder as recorder_mod
    from hf_optbench.publish import hub

    calls: list[str] = []

    def counted(name: str, real):
        def wrapper(*args, **kwargs):
            calls.append(name if name != "write" else f"write {Path(args[0]).name}")
            return real(*args, **kwargs)
        return wrapper

    for module, name in ((run_mod, "write_json_atomic"), (recorder_mod, "write_json_atomic")):
        monkeypatch.setattr(module, name, counted("write", getattr(module, name)))
    for module, name in ((run_mod, "resolve_hyperparameters"), (run_mod, "own_output_dir"),
                         (run_mod, "check_push_possible"), (hub, "check_push_possible")):
        monkeypatch.setattr(module, name, counted(name, getattr(module, name)))
    with contextlib.redirect_stdout(io.StringIO()):
        assert run_mod.main([QUICK, "--output_dir", str(tmp_path / "run"), *SMALL, "--max_steps", "1"]) == 0
    assert calls.count("write summary.json") == 1
    assert calls.count("resolve_hyperparameters") == 1 and calls.count("own_output_dir") == 1
    assert calls.count("check_push_possible") == 1
