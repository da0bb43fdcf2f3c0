"""One resolved plan per run: every value resolved once with its source and checked whatever its source; the optimizer
built from it holds what it says (``what_ran``, for every CPU optimizer, failing loudly otherwise); a default AdamW
run's config.yaml, summary.json and TensorBoard say the beta2 it used (0.99, not transformers' 0.999); config.yaml
reruns the run to the same loss and the same plan; the final model loads from the run directory; a run resolves the
optimizer's name once and stamps nothing on the optimizer or the scheduler."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch
import yaml

from hf_optbench.config.parse import parse_args
from hf_optbench.errors import OptBenchError
from hf_optbench.optim.registry import OPTIMIZERS, build_resolved
from hf_optbench.optim.schedules import scheduler_from_record
from hf_optbench.optim.unwrap import innermost_optimizer
from hf_optbench.run import train as run_mod
from hf_optbench.run.plan import resolve_optimization, what_ran

from fixtures.models import tiny_model, token_data
from fixtures.tensorboard import read_tensorboard

ROOT = Path(__file__).resolve().parents[2]
QUICK = str(ROOT / "recipes" / "quickstart_cpu.yaml")
SMALL = ["--max_steps", "3", "--eval_steps", "3", "--per_device_train_batch_size", "4", "--block_size", "32",
         "--timing_warmup_steps", "1", "--save_strategy", "no"]
CPU_OPTIMIZERS = [name for name, spec in OPTIMIZERS.items() if not spec.requires_cuda]


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def _parse(tmp_path: Path, *extra: str):
    return parse_args([QUICK, "--output_dir", str(tmp_path / "run"), *extra])


@pytest.mark.parametrize("name", CPU_OPTIMIZERS)
def test_the_optimizer_built_from_the_plan_holds_it_after_a_step(name: str, tmp_path: Path) -> None:
    """Every CPU optimizer: the plan's groups (rate and decay with their sources) are what the builder made, and
    the checked record equals the param groups after a step of its schedule."""
    free = ["--schedule", "none"] if OPTIMIZERS[name].schedule_free else []  # the recipe names gpt3_cosine
    opt_plan, _, schedule = resolve_optimization(_parse(tmp_path, "--optimizer", name, *free))
    model = tiny_model()
    opt, _ = build_resolved(opt_plan.spec, model, lr=opt_plan.learning_rate.value,
                            weight_decay=opt_plan.weight_decay.value, ctor=opt_plan.constructor_values())
    groups = what_ran(opt_plan, opt, model)
    sched = scheduler_from_record(schedule, opt)
    if hasattr(opt, "train"):
        opt.train()  # schedule-free: step in train mode
    batch = token_data(2)
    loss = model(input_ids=torch.stack([b["input_ids"] for b in batch]),
                 labels=torch.stack([b["labels"] for b in batch])).loss
    loss.backward()
    opt.step()
    sched.step()
    held = innermost_optimizer(opt).param_groups
    assert [g["group"] for g in groups] == [g.name for g in opt_plan.groups][:len(groups)]
    for recorded, group in zip(groups, held, strict=True):
        for key, value in recorded.items():
            if key == "tensors":
                assert value == len(group["params"])
            elif key == "lr":  # the rate the group was built with; the schedule scales it per step
                assert value == group.get("initial_lr", group["lr"]), (name, key)
            elif key != "group":
                assert _plain(value) == _plain(group[key]), (name, key, value, group[key])
    assert not [k for k in vars(opt) if k.startswith("hf_optbench")]
    assert not [k for k in vars(sched) if k.startswith("hf_optbench")]


def test_what_ran_fails_loudly_when_a_group_is_not_the_planned_one(tmp_path: Path) -> None:
    opt_plan, _, _ = resolve_optimization(_parse(tmp_path, "--optimizer", "lion"))
    model = tiny_model()
    opt, _ = build_resolved(opt_plan.spec, model, lr=opt_plan.learning_rate.value,
                            weight_decay=opt_plan.weight_decay.value, ctor=opt_plan.constructor_values())
    opt.param_groups[1]["weight_decay"] = 0.3  # a builder that decayed the biases and gains
    with pytest.raises(RuntimeError, match="group 'no_decay' holds weight_decay 0.3, the plan says 0.0"):
        what_ran(opt_plan, opt, model)


def test_a_group_rate_set_by_a_constructor_argument_has_its_own_source(tmp_path: Path) -> None:
    """Muon's matrices at muon_lr (the user's), its AdamW part at the cited learning rate: the plan says so per
    group, and the built optimizer holds it."""
    opt_plan, _, _ = resolve_optimization(_parse(tmp_path, "--optimizer", "muon", "--optimizer_kwargs",
                                                 '{"muon_lr": 0.02}'))
    by_name = {g.name: g for g in opt_plan.groups}
    assert by_name["muon"].lr.value == 0.02 and by_name["muon"].lr.source == "user"
    assert by_name["adamw_decay"].lr == opt_plan.learning_rate != by_name["muon"].lr
    assert by_name["adamw_no_decay"].weight_decay.value == 0.0
    model = tiny_model()
    opt, _ = build_resolved(opt_plan.spec, model, lr=opt_plan.learning_rate.value,
                            weight_decay=opt_plan.weight_decay.value, ctor=opt_plan.constructor_values())
    assert [g["group"] for g in what_ran(opt_plan, opt, model)] == ["muon", "adamw_decay", "adamw_no_decay"]


def test_a_value_is_checked_whatever_its_source(tmp_path: Path, monkeypatch) -> None:
    """A tuned file's max_grad_norm -5 is refused by the plan itself, naming the file, even past the file check."""
    from hf_optbench.config import checks

    tuned = tmp_path / "tuned.yaml"
    tuned.write_text("adamw:\n  tiny: {learning_rate: 0.002, max_grad_norm: -5}\n")
    monkeypatch.setattr(checks, "check_tuned_file", lambda path: None)
    cfg = _parse(tmp_path, "--tuned_hparams_file", str(tuned))
    with pytest.raises(OptBenchError, match=rf"max_grad_norm -5.* \(from tuned: {tuned.name}\) must be a finite"):
        resolve_optimization(cfg)


def test_the_plan_writes_nothing_back_into_the_parsed_arguments(tmp_path: Path) -> None:
    """The parsed arguments stay what was asked: the plan holds the resolved learning rate (the citation), the
    arguments transformers' default."""
    from hf_optbench.run.plan import resolve_plan

    cfg = _parse(tmp_path, "--adam_beta2", "0.95")
    before = (cfg.training.learning_rate, cfg.training.weight_decay, cfg.optim.optimizer_kwargs)
    plan = resolve_plan(cfg)
    assert (cfg.training.learning_rate, cfg.training.weight_decay, cfg.optim.optimizer_kwargs) == before
    assert plan.optimizer.learning_rate.value == 1e-3 and "nanoGPT" in plan.optimizer.learning_rate.source
    assert plan.optimizer.constructor["betas"].value == (0.9, 0.95)
    args = plan.trainer_args({"optimizer": "adamw", "hyperparameters": plan.hyperparameters()})
    assert (args.learning_rate, args.adam_beta2, args.optim) == (1e-3, 0.95, "hf_optbench:adamw")
    assert args is not cfg.training and cfg.training.adam_beta2 == 0.95 and cfg.training.optim != args.optim
    assert plan.batch.tokens_per_step == 8 * 1 * 1 * 128


@pytest.fixture(scope="module")
def adamw_run(tmp_path_factory) -> Path:
    """The default AdamW quickstart, 3 steps, reporting to TensorBoard."""
    pytest.importorskip("tensorboard")
    out = tmp_path_factory.mktemp("adamw") / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        assert run_mod.main([QUICK, "--output_dir", str(out), "--report_to", "tensorboard", *SMALL]) == 0
    return out




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
    args, hparams, _ = read_tensorboard(adamw_run)
    assert (args["adam_beta2"], args["weight_decay"], args["optim"]) == (0.99, 0.1, "hf_optbench:adamw")
    assert args["lr_scheduler_type"] == "cosine_with_min_lr"
    assert hparams["hf_optbench/hyperparameters/betas/value"] == "[0.9, 0.99]"
    assert hparams["hf_optbench/hyperparameters/weight_decay/value"] == pytest.approx(0.1)


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
    assert second["plan_hash"] == first["plan_hash"]  # the same plan: every resolved value, the data's content
    assert second["hyperparameter_sources"]["learning_rate"] == "user"  # config.yaml states the cited value


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
    """One writer of summary.json (the run, not also the recorder), one plan, one resolution of the optimizer's
    name, one read of the recipe, one lock of output_dir, one check of the Hub upload; and nothing stamped on the
    optimizer or the scheduler the Trainer ran."""
    import transformers

    from hf_optbench.config import parse
    from hf_optbench.measure import recorder as recorder_mod
    from hf_optbench.optim import registry
    from hf_optbench.publish import hub
    from hf_optbench.run import plan, preflight

    calls: list[str] = []
    held: dict[str, object] = {}

    def counted(name: str, real):
        def wrapper(*args, **kwargs):
            calls.append(name if name != "write" else f"write {Path(args[0]).name}")
            return real(*args, **kwargs)
        return wrapper

    for module, name in ((run_mod, "write_json_atomic"), (recorder_mod, "write_json_atomic")):
        monkeypatch.setattr(module, name, counted("write", getattr(module, name)))
    for module, name in ((plan, "resolve_plan"), (run_mod, "own_output_dir"), (run_mod, "check_push_possible"),
                         (hub, "check_push_possible"), (registry, "resolve_optimizer_name"),
                         (parse, "load_recipe"), (preflight, "load_recipe")):
        monkeypatch.setattr(module, name, counted(name, getattr(module, name)))
    real_train = transformers.Trainer.train

    def train(trainer, *args, **kwargs):
        out = real_train(trainer, *args, **kwargs)
        held.update(optimizer=trainer.optimizer, scheduler=trainer.lr_scheduler)
        return out

    monkeypatch.setattr(transformers.Trainer, "train", train)
    with contextlib.redirect_stdout(io.StringIO()):
        assert run_mod.main([QUICK, "--output_dir", str(tmp_path / "run"), *SMALL, "--max_steps", "1"]) == 0
    assert calls.count("write summary.json") == 1
    assert calls.count("resolve_plan") == 1 and calls.count("own_output_dir") == 1
    assert calls.count("resolve_optimizer_name") == 1 and calls.count("load_recipe") == 1
    assert calls.count("check_push_possible") == 1
    from hf_optbench.optim.unwrap import optimizer_chain

    objects = [*optimizer_chain(held["optimizer"]), held["scheduler"]]
    assert not [k for o in objects for k in vars(o) if k.startswith("hf_optbench")]


def test_muon_s_newton_schulz_precision_is_resolved_once_with_its_reason(tmp_path: Path, monkeypatch) -> None:
    """ns_precision auto becomes bf16 or fp32 in the plan, timed on the run's own matrices (both timings and the
    accuracy check in its source, beside the citation of the reference implementation), measured once and cached in
    the data cache directory; a forced value is the user's; the precision is part of the plan's identity (it changes
    what is trained). Timings injected: the choice is tested, not this machine's speed."""
    from hf_optbench.optim import muon_precision
    from hf_optbench.run.plan import resolve_plan

    calls: list[list[tuple[int, int]]] = []

    def fake(shapes):
        calls.append(shapes)
        return {"bf16_ms": 3.0, "fp32_ms": 2.0, "bf16_error": 0.01, "bf16_timed": True}

    monkeypatch.setattr(muon_precision, "measure", fake)
    monkeypatch.setattr(muon_precision, "_MEMO", {})
    cache = ["--data_cache_dir", str(tmp_path / "cache")]
    plan = resolve_plan(_parse(tmp_path, "--optimizer", "muon", *cache))
    entry = plan.optimizer.constructor["ns_precision"]
    assert entry.value == "fp32" and calls == [muon_precision.gpt2_matrix_shapes(2, 64)]  # tiny: 2 blocks of 64
    assert entry.source.startswith("auto: measured Newton-Schulz on this run's matrices (2x64x64,2x64x192,4x64x256; ")
    assert "bf16 3.00 ms, fp32 2.00 ms" in entry.source and "KellerJordan/Muon" in entry.source
    assert plan.identity["optimizer_constructor"]["ns_precision"] == "fp32"
    monkeypatch.setattr(muon_precision, "_MEMO", {})  # another process: the file answers, nothing is timed again
    again = resolve_plan(_parse(tmp_path, "--optimizer", "muon", *cache))
    assert len(calls) == 1 and again.plan_hash == plan.plan_hash
    assert "cached in" in again.optimizer.constructor["ns_precision"].source
    forced = resolve_plan(_parse(tmp_path, "--optimizer", "muon", "--optimizer_kwargs", '{"ns_precision": "bf16"}'))
    assert forced.optimizer.constructor["ns_precision"].value == "bf16"
    assert forced.optimizer.constructor["ns_precision"].source == "user" and forced.plan_hash != plan.plan_hash
    with pytest.raises(OptBenchError, match="ns_precision 'fp8' is not one of"):
        resolve_plan(_parse(tmp_path, "--optimizer", "muon", "--optimizer_kwargs", '{"ns_precision": "fp8"}'))


@pytest.mark.slow
def test_auto_takes_fp32_where_onednn_has_no_native_bf16(tmp_path: Path) -> None:
    """With oneDNN, ATen and MKL held to AVX2 (the emulation of an AVX2-only CPU: torch then runs bf16 matmuls in
    ATen's reference gemm), auto measures bf16 as the slower precision and resolves to fp32, saying so; the
    emulation is a machine of its own in the cache (the native one's choice is not read)."""
    import os
    import subprocess
    import sys

    code = ("from hf_optbench.config.parse import parse_args; from hf_optbench.run.plan import "
            f"resolve_plan; e = resolve_plan(parse_args([{QUICK!r}, '--output_dir', {str(tmp_path / 'r')!r}, "
            f"'--data_cache_dir', {str(tmp_path / 'cache')!r}, "
            "'--optimizer', 'muon'])).optimizer.constructor['ns_precision']; print(e.value, '|', e.source)")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True)
    value, source = out.stdout.strip().splitlines()[-1].split(" | ", 1)
    assert value == "fp32" and "fp32 is faster" in source and "bf16 native False" in source


@pytest.mark.slow
def test_a_muon_run_records_its_newton_schulz_precision_everywhere(tmp_path: Path) -> None:
    """summary.json (value, source, and the implementation string the report's step-time table shows), the card and
    the tracker section all say which precision ran and why; config.yaml pins it (auto would pick again wherever the
    run is rerun)."""
    pytest.importorskip("tensorboard")
    out = tmp_path / "muon"
    with contextlib.redirect_stdout(io.StringIO()):
        assert run_mod.main([QUICK, "--output_dir", str(out), "--optimizer", "muon", "--report_to", "tensorboard",
                             *SMALL, "--max_steps", "2"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    ran = summary["hyperparameters"]["ns_precision"]["value"]
    assert ran in ("bf16", "fp32")
    assert summary["hyperparameters"]["ns_precision"]["source"].startswith("auto: measured Newton-Schulz")
    assert f"Newton-Schulz {ran}" in summary["optimizer_impl"]
    assert [g.get("ns_precision") for g in summary["param_groups"]] == [ran, None, None]
    assert f'ns_precision "{ran}"' in (out / "README.md").read_text()
    _, hparams, section = read_tensorboard(out)
    assert section["hyperparameters"]["ns_precision"]["value"] == ran
    assert section["hyperparameters"]["ns_precision"]["source"].startswith("auto: measured Newton-Schulz")
    assert hparams["hf_optbench/hyperparameters/ns_precision/value"] == ran
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert json.loads(config["optimizer_kwargs"])["ns_precision"] == ran
