"""hf_optbench/measure/tracking.py and the run's tracker wiring: what W&B, TensorBoard and trackio show for a Lion run with
the GPT-3 cosine is Lion, its implementation and gpt3_cosine; eval figures under eval/; no placement warning."""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from hf_optbench.measure.tracking import flat_hparams, tracker_config
from hf_optbench.run import train as run_mod

from fixtures.tensorboard import read_tensorboard

ROOT = Path(__file__).resolve().parents[2]
QUICK = str(ROOT / "recipes" / "quickstart_cpu.yaml")
LION_COSINE = ["--optimizer", "lion", "--schedule", "gpt3_cosine", "--max_steps", "4", "--eval_steps", "2",
               "--per_device_train_batch_size", "4", "--block_size", "32", "--timing_warmup_steps", "1",
               "--save_strategy", "no", "--write_model_card", "false"]
PLACEMENT = ("was not added with attach_callbacks", "runs before OptBenchRecorder")


def _run(out: Path, report_to: str) -> list[str]:
    """One Lion + cosine run reporting to ``report_to``; returns the recorder's placement warnings."""
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("always")
        rc = run_mod.main([QUICK, "--output_dir", str(out), "--report_to", report_to, *LION_COSINE])
    assert rc == 0
    return [str(w.message) for w in caught if any(p in str(w.message) for p in PLACEMENT)]


def _check_section(section: dict) -> None:
    assert section["optimizer"] == "lion"
    assert section["optimizer_impl"].startswith("lion_pytorch")
    assert section["schedule"]["name"] == "gpt3_cosine" and section["schedule"]["min_lr_ratio"] == 0.1
    hp = section["hyperparameters"]
    assert {"learning_rate", "weight_decay", "max_grad_norm", "betas"} <= set(hp)
    assert all(entry["source"] for entry in hp.values())
    # the values Lion ran with (its groups), not torch's optimizer.defaults (weight_decay 0.0 there)
    assert hp["betas"]["value"] == [0.9, 0.99] and hp["weight_decay"]["value"] == 0.3
    assert [g["weight_decay"] for g in section["param_groups"]] == [0.3, 0.0]
    assert "constructor" not in section and section["model_size"] == "tiny"


@pytest.fixture(scope="module")
def tensorboard_run(tmp_path_factory) -> dict:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path_factory.mktemp("tb") / "run"
    placement = _run(out, "tensorboard")
    event_dirs = {p.parent for p in out.glob("runs/**/events.out.tfevents.*")}
    assert len(event_dirs) == 1, event_dirs
    acc = EventAccumulator(str(event_dirs.pop()), size_guidance={"tensors": 0})
    acc.Reload()
    return {"acc": acc, "placement": placement, "out": out}


def _text(acc, tag: str) -> str:
    return acc.Tensors(f"{tag}/text_summary")[0].tensor_proto.string_val[0].decode()


def test_tensorboard_args_text_names_lion_and_the_cosine(tensorboard_run: dict) -> None:
    args = json.loads(_text(tensorboard_run["acc"], "args"))
    assert args["optim"] == "hf_optbench:lion"  # not transformers' default adamw_torch_fused
    assert args["lr_scheduler_type"] == "cosine_with_min_lr"  # not "linear"
    assert args["lr_scheduler_kwargs"] == {"min_lr_rate": 0.1, "num_cycles": 0.5}
    # Lion's own values, not transformers' defaults (5e-05, 0.0, 0.999)
    assert (args["learning_rate"], args["weight_decay"]) == (3.33e-4, 0.3)
    assert (args["adam_beta1"], args["adam_beta2"]) == (0.9, 0.99)


def test_tensorboard_holds_the_hf_optbench_config_and_hparams(tensorboard_run: dict) -> None:
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = tensorboard_run["acc"]
    text = _text(acc, "hf_optbench")
    _check_section(json.loads(text.split("```json\n", 1)[1].rsplit("```", 1)[0]))
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = start.session_start_info.hparams
    assert hparams["hf_optbench/optimizer"].string_value == "lion"
    assert hparams["hf_optbench/optimizer_impl"].string_value.startswith("lion_pytorch")
    assert hparams["hf_optbench/schedule/name"].string_value == "gpt3_cosine"
    assert hparams["hf_optbench/hyperparameters/learning_rate/value"].number_value == pytest.approx(3.33e-4)
    assert hparams["hf_optbench/hyperparameters/weight_decay/value"].number_value == pytest.approx(0.3)
    assert "hf_optbench/constructor/weight_decay" not in hparams  # torch's defaults, not what ran
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} == {"train/loss", "eval/loss", "eval/accuracy"}


def test_tensorboard_eval_figures_are_under_eval(tensorboard_run: dict) -> None:
    tags = set(tensorboard_run["acc"].Tags()["scalars"])
    assert {"eval/loss", "eval/accuracy", "eval/optbench/perplexity"} <= tags, sorted(tags)
    assert not [t for t in tags if t.startswith("train/") and "eval" in t], sorted(tags)


def test_run_with_report_to_raises_no_placement_warning(tensorboard_run: dict) -> None:
    assert tensorboard_run["placement"] == []


def test_run_reports_eval_accuracy_in_rows_and_summary(tensorboard_run: dict) -> None:
    out = tensorboard_run["out"]
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "eval"]
    assert [r["step"] for r in evals] == [2, 4] and all(0.0 <= r["eval_accuracy"] <= 1.0 for r in evals)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_eval_accuracy"] == evals[-1]["eval_accuracy"]


@pytest.mark.slow
def test_wandb_run_config_names_lion_and_the_cosine(tmp_path, monkeypatch) -> None:
    """Read from the wandb run object in-process, before finish(): its config is what the SDK syncs (never the
    offline files, which the wandb service writes asynchronously)."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    try:
        placement = _run(tmp_path / "run", "wandb")
        assert wandb.run is not None
        config = dict(wandb.run.config)
    finally:
        wandb.finish()
    assert placement == []
    assert config["optim"] == "hf_optbench:lion" and config["lr_scheduler_type"] == "cosine_with_min_lr"
    assert (config["weight_decay"], config["adam_beta2"]) == (0.3, 0.99)
    _check_section(config["hf_optbench"])


def test_trackio_receives_the_flat_section() -> None:
    """trackio is not installed here: its TrackioCallback is built without __init__ (which imports trackio) and
    given a recording stand-in for the module; this checks our dispatch and payload, not trackio itself."""
    from transformers.integrations.integration_utils import TrackioCallback

    from hf_optbench.measure.tracking import _push_all

    received: dict = {}
    config_store = SimpleNamespace(update=lambda d, allow_val_change=False: received.update(d))
    callback = object.__new__(TrackioCallback)
    callback._trackio, callback._initialized = SimpleNamespace(config=config_store), True
    section = {"optimizer": "lion", "schedule": {"name": "gpt3_cosine"}, "hyperparameters": {
        "learning_rate": {"value": 3e-4, "source": "a paper"}}, "constructor": {"betas": [0.9, 0.99]}}
    assert _push_all([callback], section) == [("trackio", True)]
    assert received == {"hf_optbench/optimizer": "lion", "hf_optbench/schedule/name": "gpt3_cosine",
                        "hf_optbench/hyperparameters/learning_rate/value": 3e-4,
                        "hf_optbench/constructor/betas": "[0.9, 0.99]"}


def test_tracker_config_of_a_built_optimizer_and_schedule() -> None:
    import torch

    from hf_optbench.optim.held import held_record
    from hf_optbench.optim.registry import CALLER_SOURCE, build_optimizer
    from hf_optbench.optim.schedules import build_scheduler

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = build_optimizer("lion", model, model_size="tiny", lr=1e-4)
    sched = build_scheduler("wsd", opt, num_training_steps=10, warmup_steps=2)
    record = held_record(opt, sched, model=model)
    section = tracker_config(record, extra={"seed": 3})
    assert section["optimizer"] == "lion" and section["schedule"]["name"] == "wsd"
    assert [g["tensors"] for g in section["param_groups"]] == [1, 3]  # matrices decay; bias and LayerNorm not
    assert section["param_groups"][1]["weight_decay"] == 0.0 and section["seed"] == 3
    assert section["hyperparameters"]["learning_rate"] == {"value": 1e-4, "source": CALLER_SOURCE}
    assert section["hyperparameters"]["weight_decay"]["value"] == 0.3  # the decayed group's, not defaults' 0.0
    assert "Chen et al. 2023" in section["hyperparameters"]["weight_decay"]["source"]  # the cited value
    json.dumps(section)  # plain values only
    flat = flat_hparams(section)
    assert all(isinstance(v, (str, int, float, bool)) for v in flat.values())
    assert "hf_optbench/hyperparameters/learning_rate/source" not in flat




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

    from fixtures.models import tiny_model, token_data

    out = tmp_path / "api"
    args = TrainingArguments(str(out), max_steps=2, per_device_train_batch_size=4, use_cpu=True, logging_steps=1,
                             logging_nan_inf_filter=False, save_strategy="no", report_to="tensorboard",
                             disable_tqdm=True, **schedule_training_args("gpt3_cosine", num_training_steps=2))
    trainer = Trainer(model=tiny_model(), args=args, train_dataset=token_data(16), data_collator=default_data_collator,
                      optimizer_cls_and_kwargs=trainer_optimizer("lion", model_size="tiny"))
    recorder, = default_callbacks(BenchArguments(), str(out), tokens_per_step=4 * 32)
    attach_callbacks(trainer, [recorder])
    trainer.train()
    recorded, hparams, section = read_tensorboard(out)
    assert recorded["optim"] == "hf_optbench:lion"
    assert (recorded["learning_rate"], recorded["weight_decay"]) == (3.33e-4, 0.3)
    assert (recorded["adam_beta1"], recorded["adam_beta2"]) == (0.9, 0.99)
    assert hparams["hf_optbench/optimizer"] == "lion"
    assert hparams["hf_optbench/hyperparameters/weight_decay/value"] == pytest.approx(0.3)
    sources = {k: v["source"] for k, v in section["hyperparameters"].items()}
    assert "Chen et al. 2023" in sources["weight_decay"] and "Chen et al. 2023" in sources["learning_rate"]


@pytest.mark.slow
def test_the_plain_trainer_idiom_records_what_the_objects_hold(tmp_path: Path) -> None:
    """``Trainer(optimizers=(build_optimizer("lion"), build_scheduler("gpt3_cosine")), callbacks=[recorder])``: what
    TensorBoard records and the recorder's own summary.json say is Lion at 3.33e-4 / 0.3 / 0.99 with the cosine
    and its 1-step warmup read from the scheduler (at init end, before the integrations record the arguments), not
    transformers' adamw_torch_fused, 5e-05, 0.0, 0.999, linear, warmup 0; the recorder passed the usual way moves
    itself before the integrations, so TensorBoard also gets the hf_optbench section and the optbench/ figures,
    with no placement warning."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import Trainer, TrainingArguments, default_data_collator

    from hf_optbench.config.bench_args import BenchArguments
    from hf_optbench.measure.recorder import default_callbacks
    from hf_optbench.optim.registry import build_optimizer
    from hf_optbench.optim.schedules import build_scheduler

    from fixtures.models import tiny_model, token_data

    out = tmp_path / "plain"
    model = tiny_model()
    opt = build_optimizer("lion", model, model_size="tiny")
    sched = build_scheduler("gpt3_cosine", opt, num_training_steps=2, warmup_steps=1)
    args = TrainingArguments(str(out), max_steps=2, per_device_train_batch_size=4, use_cpu=True, logging_steps=1,
                             logging_nan_inf_filter=False, save_strategy="no", report_to="tensorboard",
                             disable_tqdm=True)
    recorder, = default_callbacks(BenchArguments(), str(out), tokens_per_step=4 * 32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(model=model, args=args, train_dataset=token_data(16), data_collator=default_data_collator,
                optimizers=(opt, sched), callbacks=[recorder]).train()
    assert not [w for w in caught if any(p in str(w.message) for p in PLACEMENT)]
    recorded, hparams, section = read_tensorboard(out)
    assert hparams["hf_optbench/optimizer"] == "lion" and section["schedule"]["name"] == "gpt3_cosine"
    assert recorded["optim"] == "hf_optbench:lion"
    assert (recorded["learning_rate"], recorded["weight_decay"]) == (3.33e-4, 0.3)
    assert (recorded["adam_beta1"], recorded["adam_beta2"]) == (0.9, 0.99)
    assert recorded["lr_scheduler_type"] == "cosine_with_min_lr" and recorded["warmup_steps"] == 1
    event_dir = next(p.parent for p in out.glob("runs/**/events.out.tfevents.*"))
    acc = EventAccumulator(str(event_dir))
    acc.Reload()
    assert "train/optbench/tokens" in acc.Tags()["scalars"], acc.Tags()["scalars"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["optimizer"] == "lion" and summary["optimizer_impl"].startswith("lion_pytorch")
    assert summary["hyperparameters"]["weight_decay"]["value"] == 0.3
    assert "Chen et al. 2023" in summary["hyperparameters"]["learning_rate"]["source"]
    assert summary["schedule"] == "gpt3_cosine" and summary["schedule_resolved"]["min_lr_ratio"] == 0.1
    assert summary["schedule_resolved"]["warmup_steps"] == 1
    assert [g["weight_decay"] for g in summary["param_groups"]] == [0.3, 0.0]
