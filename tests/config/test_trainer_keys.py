"""TrainingArguments' own keys in a recipe (issue 39 item 5): TRL and alignment-handbook recipes write optim,
lr_scheduler_type, lr_scheduler_kwargs, num_train_epochs and warmup_ratio; they mean here what they mean to a
Hugging Face user, a name hf_optbench cannot build is refused by name, and two spellings of one setting stop the
run naming both, before torch is imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hf_optbench.config.parse import check_keys, parse_args
from hf_optbench.config.trainer_keys import SPELLINGS, TRANSFORMERS_OPTIM, TRANSFORMERS_SCHEDULES, translate
from hf_optbench.errors import OptBenchError

ROOT = Path(__file__).resolve().parents[2]
TRL_RECIPE = ROOT / "recipes" / "trl_style_cpu.yaml"


def _recipe(tmp_path: Path, **keys) -> str:
    path = tmp_path / "r.yaml"
    base = {"model_size": "tiny", "data_source": "thai_sample", "tokenizer_name": "builtin:thai-bpe-2k",
            "use_cpu": True, "output_dir": str(tmp_path / "out")}
    path.write_text(yaml.safe_dump({**base, **keys}))
    return str(path)


def test_the_trl_style_recipe_parses_with_the_hugging_face_meaning(tmp_path: Path) -> None:
    raw = yaml.safe_load(TRL_RECIPE.read_text())
    assert not set(raw) & {"optimizer", "schedule", "max_steps", "warmup_steps"}  # TrainingArguments' keys only
    cfg = parse_args([str(TRL_RECIPE), "--output_dir", str(tmp_path / "out")])
    assert (cfg.optim.optimizer, cfg.optim.schedule) == ("lion_32bit", "cosine")
    assert cfg.training.warmup_steps == 0.1 and cfg.trainer_keys.epochs == 1.0 and cfg.training.max_steps == -1
    assert cfg.trainer_keys.given == {"optim": "lion_32bit", "lr_scheduler_type": "cosine", "warmup_ratio": 0.1,
                                      "num_train_epochs": 1}
    assert {"optimizer", "schedule", "warmup_steps"} <= cfg.explicit and "max_steps" not in cfg.explicit


def _kind(opt) -> tuple:
    """What computes the update: the class, and for bitsandbytes (whose AdamW8bit and AdamW(optim_bits=8) are
    sibling classes of one Optimizer2State) its update rule, state bits and paging."""
    if type(opt).__module__.startswith("bitsandbytes"):
        return opt.optimizer_name, opt.args.optim_bits, opt.is_paged
    return (type(opt),)


@pytest.mark.parametrize("name", sorted(TRANSFORMERS_OPTIM))
def test_each_transformers_optim_builds_what_transformers_builds(name: str, tmp_path: Path) -> None:
    """The optimizer transformers 5's Trainer.get_optimizer_cls_and_kwargs builds for the name: the same class (or
    bitsandbytes update and bits) and the same kernel and constructor switches."""
    from transformers import Trainer, TrainingArguments

    if name.startswith("paged_"):
        pytest.skip("paged bitsandbytes optimizers need CUDA")
    pytest.importorskip("bitsandbytes" if "bit" in name else "torch")
    if name == "schedule_free_adamw":
        pytest.importorskip("schedulefree")
    from hf_optbench.optim.registry import build_optimizer

    from fixtures.models import tiny_model

    registry, ctor = TRANSFORMERS_OPTIM[name]
    model = tiny_model()
    built = build_optimizer(registry, model, model_size="tiny", lr=1e-3, **ctor)
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(TrainingArguments(str(tmp_path), optim=name, use_cpu=True))
    theirs = cls([p for p in model.parameters()], **kwargs)
    assert _kind(built) == _kind(theirs)
    for key in ("fused", "foreach", "momentum", "nesterov", "scale_parameter", "relative_step", "warmup_init"):
        if key in theirs.defaults:
            assert built.defaults[key] == theirs.defaults[key], key


def test_a_name_hf_optbench_cannot_build_is_refused_by_name() -> None:
    with pytest.raises(OptBenchError, match="optim 'galore_adamw' .*not one of transformers' optimizers hf_optbench"):
        check_keys({"optim": "galore_adamw"}, [], "x.yaml")
    with pytest.raises(OptBenchError, match="lr_scheduler_type 'polynomial' .*It runs linear, cosine"):
        check_keys({"lr_scheduler_type": "polynomial"}, [], "x.yaml")
    assert translate({"optim": "hf_optbench:muon"}, [], "x.yaml")[2].became == {"optimizer": "muon"}


TWO_SPELLINGS = [("optim", "adamw_torch"), ("lr_scheduler_type", "cosine"), ("lr_scheduler_kwargs", {"num_cycles": 0.5}),
                 ("num_train_epochs", 1), ("warmup_ratio", 0.1)]
OURS_VALUE = {"optimizer": "lion", "schedule": "wsd", "schedule_kwargs": "{}", "max_steps": 10, "warmup_steps": 2}


@pytest.mark.parametrize("trainer_key, value", TWO_SPELLINGS)
def test_both_spellings_of_one_setting_in_one_place_are_an_error_naming_both(trainer_key: str, value) -> None:
    assert set(SPELLINGS) == {"optim", "lr_scheduler_type", "lr_scheduler_kwargs", "num_train_epochs", "warmup_ratio"}
    ours = SPELLINGS[trainer_key]
    with pytest.raises(OptBenchError, match=rf"'{trainer_key}' \(in recipe 'x.yaml'\) and '{ours}' \(in recipe 'x.yaml'\) "
                                            "both"):
        check_keys({trainer_key: value, ours: OURS_VALUE[ours]}, [], "x.yaml")
    cli = json.dumps(value) if isinstance(value, dict) else str(value)
    with pytest.raises(OptBenchError, match=rf"'{trainer_key}' \(in the command line\) and '{ours}' \(in the command "
                                            r"line\) both"):
        check_keys({}, [f"--{trainer_key}", cli, f"--{ours}", str(OURS_VALUE[ours])], "x.yaml")


@pytest.mark.parametrize("trainer_key, value", TWO_SPELLINGS)
def test_the_command_line_beats_the_recipe_whichever_spelling_each_uses(trainer_key: str, value) -> None:
    """``--num_train_epochs 1`` over a recipe's ``max_steps`` (and the other way round): the command line wins, as
    it does for every key, instead of "both set"."""
    ours = SPELLINGS[trainer_key]
    recipe, tokens, keys = translate({ours: OURS_VALUE[ours]}, [f"--{trainer_key}",
                                     json.dumps(value) if isinstance(value, dict) else str(value)], "x.yaml")
    assert ours not in recipe and trainer_key in keys.given  # the recipe's spelling dropped, the command line's kept
    recipe, tokens, keys = translate({trainer_key: value}, [f"--{ours}", str(OURS_VALUE[ours])], "x.yaml")
    assert not keys.given and f"--{ours}" in tokens  # the recipe's TrainingArguments key dropped


def test_command_line_spellings_translate_like_the_recipe_and_merge_constructor_arguments(tmp_path: Path) -> None:
    cfg = parse_args([_recipe(tmp_path), "--optim", "adamw_torch", "--optimizer_kwargs", '{"betas": [0.9, 0.95]}',
                      "--lr-scheduler-type=cosine_with_min_lr", "--lr_scheduler_kwargs", '{"min_lr_rate": 0.05}',
                      "--max_steps", "20"])
    assert cfg.optim.optimizer == "adamw" and cfg.optim.kwargs() == {"betas": [0.9, 0.95], "fused": None}
    assert (cfg.optim.schedule, cfg.optim.min_lr_ratio) == ("gpt3_cosine", 0.05)
    with pytest.raises(OptBenchError, match="optim 'adamw_torch_fused' .*fused=True.*optimizer_kwargs sets fused"):
        check_keys({"optim": "adamw_torch_fused", "optimizer_kwargs": {"fused": False}}, [], "x.yaml")
    with pytest.raises(OptBenchError, match="lr_scheduler_kwargs 'min_lr' .*min_lr_rate"):
        check_keys({"lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": {"min_lr": 1e-5}}, [], "x.yaml")
    wsd = translate({"lr_scheduler_type": "warmup_stable_decay", "max_steps": 100,
                     "lr_scheduler_kwargs": {"num_decay_steps": 20, "decay_type": "cosine"}}, [], "x.yaml")[2]
    assert wsd.became["schedule_kwargs"] == {"decay_type": "cosine", "decay_ratio": 0.2}
    assert set(TRANSFORMERS_SCHEDULES.values()) <= set(__import__("hf_optbench.optim.schedules").optim.schedules.SCHEDULES)


def test_epochs_become_steps_by_transformers_rule() -> None:
    from types import SimpleNamespace

    from hf_optbench.run.epochs import epoch_steps

    args = SimpleNamespace(per_device_train_batch_size=4, world_size=2, gradient_accumulation_steps=3,
                           dataloader_drop_last=True)
    got = epoch_steps(1.5, 100, args)  # 12 micro-batches of 4 x 2 processes; 4 steps per epoch
    assert (got["micro_batches_per_epoch"], got["steps_per_epoch"], got["max_steps"]) == (12, 4, 6)
    assert epoch_steps(1, 104, args)["steps_per_epoch"] == 5  # 13 micro-batches: a remainder counts as a step


def test_validate_translates_before_torch(tmp_path: Path) -> None:
    """The keys' checks answer without importing torch, as `validate` promises."""
    code = ("import sys; from hf_optbench.cli import main; rc = main(['validate', sys.argv[1]]);"
            "print(rc, 'torch' in sys.modules)")
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim: adamw_torch\noptimizer: lion\n")
    good = proc = None
    for path in (str(TRL_RECIPE), str(bad)):
        proc = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120)
        good = good or proc.stdout.split()
    assert good[-2:] == ["0", "False"]
    assert proc.stdout.split()[-2:] == ["2", "False"] and "'optim'" in proc.stderr and "'optimizer'" in proc.stderr


@pytest.mark.slow
def test_the_trl_style_recipe_runs_and_records_what_its_keys_became(tmp_path: Path, monkeypatch) -> None:
    import contextlib
    import io

    from hf_optbench.run import train as run_mod
    from hf_optbench.run.plan import resolve_plan

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "trl"
    with contextlib.redirect_stdout(io.StringIO()):
        assert run_mod.main([str(TRL_RECIPE), "--output_dir", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert (s["optimizer"], s["optimizer_impl"]) == ("lion_32bit", "bitsandbytes.optim.Lion32bit")
    epochs = s["trainer_keys"]["epoch_steps"]
    assert epochs["num_train_epochs"] == 1 and s["steps"] == s["max_steps"] == epochs["max_steps"] > 1
    assert s["schedule"] == "cosine" and s["schedule_resolved"]["warmup_steps"] == -(-s["max_steps"] // 10)
    assert "cache_path" not in s["data"] and s["data"]["cache_entry"].startswith("data/")
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["max_steps"] == s["max_steps"] and not set(config) & set(SPELLINGS)
    assert "min_lr_ratio" not in config  # transformers' cosine has no floor: the key had no effect, so not recorded
    rerun = parse_args([str(out / "config.yaml"), "--output_dir", str(tmp_path / "again")])
    assert resolve_plan(rerun).plan_hash == s["plan_hash"]  # config.yaml reruns the same plan, in steps
