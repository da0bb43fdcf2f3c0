from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hf_optbench.config.parse import TRAINING_DEFAULTS, check_keys, known_keys, parse_args
from hf_optbench.config.trainer_keys import TRANSFORMERS_OPTIM
from hf_optbench.errors import OptBenchError

RECIPES = sorted(Path(__file__).resolve().parents[2].joinpath("recipes").glob("*.yaml"))


def _recipe(tmp_path: Path, **values) -> str:
    path = tmp_path / "r.yaml"
    base = {"model_size": "tiny", "max_steps": 5, "output_dir": str(tmp_path / "run"), "use_cpu": True,
            "tokenizer_name": "builtin:thai-bpe-2k"}  # offline: the shipped tokenizer (the Hub default is refused)
    base.update(values)
    path.write_text(yaml.safe_dump(base))
    return str(path)


# TrainingArguments itself refuses bf16 where no GPU exists ("Your setup doesn't support bf16/gpu"), so on CPU the
# GPU recipes are parsed with only their hardware flags turned off; test_gpu_recipes_parse_unchanged runs them as-is.
CPU_OVERRIDES = ["--bf16", "false", "--use_cpu", "true"]


def _is_gpu_recipe(recipe: Path) -> bool:
    return bool(yaml.safe_load(recipe.read_text()).get("bf16") or yaml.safe_load(recipe.read_text()).get("fp16"))


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.name for p in RECIPES])
def test_every_recipe_parses(recipe: Path, tmp_path: Path) -> None:
    import torch

    overrides = CPU_OVERRIDES if _is_gpu_recipe(recipe) and not torch.cuda.is_available() else []
    cfg = parse_args([str(recipe), "--output_dir", str(tmp_path / "out"), *overrides])
    raw = yaml.safe_load(recipe.read_text())
    trainer_keys = cfg.trainer_keys.given  # a recipe in TrainingArguments' own keys (config.trainer_keys)
    assert cfg.model.model_size == raw["model_size"]
    assert cfg.optim.optimizer == raw.get("optimizer", TRANSFORMERS_OPTIM.get(raw.get("optim"), [None])[0])
    assert cfg.training.max_steps == raw.get("max_steps", -1)  # num_train_epochs: steps once the data is known
    assert set(raw) - set(trainer_keys) <= cfg.explicit
    header = recipe.read_text().split("\n", 12)
    assert any("hf_optbench.run" in line or "hf-optbench run" in line for line in header), "launch command"
    assert any("tokens/step" in line for line in header), "tokens-per-step arithmetic"


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [r for r in RECIPES if _is_gpu_recipe(r)], ids=lambda p: p.name)
def test_gpu_recipes_parse_unchanged(recipe: Path, tmp_path: Path) -> None:
    # the recipes report to W&B: without wandb installed the parse refuses them, by design (report_to_list)
    pytest.importorskip("wandb")
    cfg = parse_args([str(recipe), "--output_dir", str(tmp_path / "out")])
    assert cfg.training.bf16 is True


def test_gpu_recipes_log_every_10_to_50_steps_and_say_why() -> None:
    """Issue 42: a GPU run's host waits for the GPU only at a log (the recorder still writes every step's row)."""
    gpu = [r for r in RECIPES if _is_gpu_recipe(r)]
    assert gpu
    for recipe in gpu:
        assert 10 <= yaml.safe_load(recipe.read_text())["logging_steps"] <= 50, recipe.name
        assert "# logging_steps" in recipe.read_text(), recipe.name


def test_gpu_recipes_tokens_per_step_comment_is_right() -> None:
    for recipe in RECIPES:
        raw = yaml.safe_load(recipe.read_text())
        if raw.get("data_source") != "hub":
            continue
        tps = raw["per_device_train_batch_size"] * raw["gradient_accumulation_steps"] * 4 * raw["block_size"]
        assert f"= {tps}" in recipe.read_text().replace(",", ""), recipe.name


def test_cli_beats_yaml_beats_defaults(tmp_path: Path) -> None:
    path = _recipe(tmp_path, learning_rate=1e-3, per_device_train_batch_size=4)
    cfg = parse_args([path, "--learning_rate", "2e-3"])
    assert cfg.training.learning_rate == 2e-3  # CLI
    assert cfg.training.per_device_train_batch_size == 4  # YAML
    assert cfg.training.logging_steps == TRAINING_DEFAULTS["logging_steps"] == 10  # ours (issue 42)
    assert cfg.training.logging_nan_inf_filter is False
    assert "learning_rate" in cfg.explicit and "weight_decay" not in cfg.explicit


@pytest.mark.parametrize("recipe_keys, cli, expected", [
    ({}, [], TRAINING_DEFAULTS["eval_steps"]),  # our default strategy comes with our default interval
    ({"eval_strategy": "steps", "logging_steps": 5}, [], 5),  # the user's strategy: transformers' rule
    ({"logging_steps": 4}, ["--eval_strategy", "steps"], 4),
    ({"eval_strategy": "steps", "logging_steps": 5}, ["--eval_steps", "7"], 7),
])
def test_eval_steps_follows_transformers_rule_under_a_strategy_the_user_set(tmp_path: Path, recipe_keys: dict,
                                                                           cli: list[str], expected: int) -> None:
    """transformers evaluates every logging_steps when eval_strategy is steps and eval_steps is unset; a user who
    sets the strategy gets that rule, not our default of 50 (a 30-step run evaluated once)."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"model_size": "tiny", "data_source": "synthetic", "use_cpu": True,
                                      "max_steps": 30, **recipe_keys}))
    assert parse_args([str(recipe), "--output_dir", str(tmp_path / "o"), *cli]).training.eval_steps == expected


def test_default_output_dir_names_the_run(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = parse_args(["--optimizer", "lion", "--model_size", "mini", "--seed", "3"])
    assert Path(cfg.training.output_dir) == Path("runs/lion_mini_s3")


@pytest.mark.parametrize(
    "override, message",
    [
        (["--lerning_rate", "1e-3"], "learning_rate"),  # unknown key, with suggestion
        (["--learning_rate", "abc"], "learning_rate"),  # wrong type
        (["--optimizer", "adamm"], "adamw"),  # unknown optimizer lists/suggests names
        (["--model_size", "gpt2-hugh"], "gpt2"),  # unknown size
        (["--learning_rate", "0"], "positive"),  # non-positive learning rate
        (["--learning_rate=-1e-3"], "positive"),
        (["--optim", "galore_adamw"], "optim 'galore_adamw'.*optimizer"),  # a transformers name not built here
        (["--optim_args", "betas=0.9"], "optimizer_kwargs"),  # replaced TrainingArguments key
        (["--block_size", "256", "--n_positions", "128"], "n_positions"),
        (["--schedule", "gpt3_cosin"], "Did you mean 'gpt3_cosine'"),  # unknown schedule, with suggestion
        # a schedule set for a schedule-free optimizer is refused at parse time, before any model or data work
        (["--optimizer", "schedule_free_adamw", "--schedule", "gpt3_cosine"], "schedule-free"),
    ],
)
def test_bad_values_are_clear_errors(tmp_path: Path, override: list[str], message: str) -> None:
    with pytest.raises(OptBenchError, match=message):
        parse_args([_recipe(tmp_path), *override])


def test_unknown_yaml_key_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(OptBenchError, match=r"unknown key 'modle_size' in recipe .*Did you mean 'model_size'"):
        parse_args([_recipe(tmp_path, modle_size="tiny")])


def test_schedule_free_optimizer_accepts_no_schedule_or_none(tmp_path: Path) -> None:
    cfg = parse_args([_recipe(tmp_path), "--optimizer", "schedule_free_adamw"])
    assert cfg.optim.optimizer == "schedule_free_adamw"
    parse_args([_recipe(tmp_path), "--optimizer", "schedule_free_adamw", "--schedule", "none"])


def test_missing_recipe_file(tmp_path: Path) -> None:
    with pytest.raises(OptBenchError, match="recipe file not found"):
        parse_args([str(tmp_path / "nope.yaml")])


def test_known_keys_cover_training_arguments_without_importing_it() -> None:
    import dataclasses

    from transformers import TrainingArguments

    keys = known_keys()
    assert {f.name for f in dataclasses.fields(TrainingArguments)} <= set(keys)
    assert check_keys({"model_size": "tiny"}, ["--max_steps", "3"], "x.yaml") == {"model_size", "max_steps"}


@pytest.mark.parametrize("files, resume, needle", [
    # issue 41: a run directory is judged by every record it holds, not summary.json alone
    ({"summary.json": '{"status": "compl', "model.safetensors": "w"}, False, "holds a damaged run"),
    ({"summary.json": '{"status": "compl', "model.safetensors": "w"}, True, "holds a damaged run"),
    ({"model.safetensors": "w", "metrics.jsonl": '{"kind": "train", "step": 4}\n'}, False, "summary.json is missing"),
    ({"metrics.jsonl": '{"kind": "train", "step": 3}\n', "run_identity.json": '{"identity": {"max_steps": 9}}'},
     False, "did not finish (metrics.jsonl up to step 3, no summary.json) and kept no checkpoint"),
    ({"summary.json": '{"status": "failed"}'}, False, "did not finish (summary.json status 'failed')"),
])
def test_a_run_directory_holding_an_earlier_runs_records_is_refused(tmp_path: Path, files: dict[str, str],
                                                                    resume: bool, needle: str) -> None:
    out = tmp_path / "run"
    out.mkdir()
    for name, text in files.items():
        (out / name).write_text(text)
    argv = [_recipe(tmp_path)] + (["--resume_from_checkpoint", "true"] if resume else [])
    with pytest.raises(OptBenchError, match="--overwrite_output_dir true") as err:
        parse_args(argv)
    assert needle in str(err.value)
    assert parse_args([_recipe(tmp_path), "--overwrite_output_dir", "true"]).run.overwrite_output_dir


def test_finished_run_dir_is_protected(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text('{"status": "completed"}')
    with pytest.raises(OptBenchError, match="overwrite_output_dir"):
        parse_args([_recipe(tmp_path)])
    cfg = parse_args([_recipe(tmp_path), "--overwrite_output_dir", "true"])
    assert cfg.run.overwrite_output_dir is True


@pytest.mark.parametrize("where", ["cli", "recipe"])
def test_resume_from_checkpoint_false_is_no_resume(tmp_path: Path, where: str) -> None:
    """Issue 30 item 1: ``--resume_from_checkpoint false`` (or ``resume_from_checkpoint: false`` in a recipe) was
    read as bool("false"), a resume: a finished run in output_dir was retrained and its summary.json rewritten,
    without --overwrite_output_dir. It is no resume, so the finished run is protected."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text('{"status": "completed"}')
    argv = [_recipe(tmp_path, resume_from_checkpoint=False)] if where == "recipe" else \
        [_recipe(tmp_path), "--resume_from_checkpoint", "false"]
    with pytest.raises(OptBenchError, match="already holds a finished run"):
        parse_args(argv)


@pytest.mark.parametrize("value, request_", [
    (None, ("no", None, False)), (False, ("no", None, False)), ("false", ("no", None, False)),
    ("False", ("no", None, False)), ("0", ("no", None, False)), ("", ("no", None, False)),
    (True, ("latest", None, False)), ("true", ("latest", None, False)), ("latest", ("latest", None, False)),
    ("force", ("latest", None, True)), ("force:/a/checkpoint-2", ("path", "/a/checkpoint-2", True)),
    ("/a/checkpoint-2", ("path", "/a/checkpoint-2", False)),
])
def test_resume_is_parsed_once_into_a_request(value, request_) -> None:
    from hf_optbench.config.parse import ResumeRequest, parse_resume

    assert parse_resume(value) == ResumeRequest(*request_)


def test_a_tuned_file_may_not_set_what_the_command_line_refuses(tmp_path: Path) -> None:
    """Issue 30 item 7: a tuned file's max_grad_norm -5 was accepted and recorded as tuned (the command line refuses
    it, and the run's own config.yaml then failed validate): refused before any work, naming the file."""
    tuned = tmp_path / "tuned.yaml"
    tuned.write_text("adamw:\n  tiny: {learning_rate: 0.002, max_grad_norm: -5}\n")
    with pytest.raises(OptBenchError, match=r"tuned.yaml': adamw/tiny max_grad_norm is -5, not a finite number >= 0"):
        parse_args([_recipe(tmp_path), "--tuned_hparams_file", str(tuned)])


def test_unfinished_run_with_checkpoints_needs_a_decision(tmp_path: Path) -> None:
    (tmp_path / "run" / "checkpoint-2").mkdir(parents=True)
    (tmp_path / "run" / "run_identity.json").write_text("{}")  # a run writes it before it trains
    with pytest.raises(OptBenchError, match="checkpoints of an unfinished run.*resume_from_checkpoint"):
        parse_args([_recipe(tmp_path)])
    parse_args([_recipe(tmp_path), "--resume_from_checkpoint", "true"])


# -- recipes as parser defaults: list and mapping values --------------------------------------------------------


def test_recipe_lists_and_mappings_keep_their_types(tmp_path: Path) -> None:
    path = _recipe(tmp_path, report_to=["tensorboard", "wandb"], optimizer_kwargs={"betas": [0.9, 0.95]},
                   target_losses=[5.0, 4.5], run_name="r1")
    cfg = parse_args([path])
    assert cfg.training.report_to == ["tensorboard", "wandb"]  # was: exit 2, "not used by HfArgumentParser: ['wandb']"
    assert cfg.optim.kwargs() == {"betas": [0.9, 0.95]}
    assert cfg.bench.target_losses == [5.0, 4.5]
    assert {"report_to", "optimizer_kwargs", "target_losses"} <= cfg.explicit


@pytest.mark.parametrize("cli", [["--report_to", "tensorboard", "wandb"], ["--report_to", "tensorboard,wandb"],
                                 ["--report_to=tensorboard,wandb"], ["--report-to", "tensorboard", "wandb"]])
def test_cli_report_to_takes_a_list(cli: list[str], tmp_path: Path) -> None:
    assert parse_args([_recipe(tmp_path), *cli]).training.report_to == ["tensorboard", "wandb"]


def test_cli_beats_recipe_lists_and_mappings(tmp_path: Path) -> None:
    path = _recipe(tmp_path, report_to=["tensorboard", "wandb"], optimizer_kwargs={"betas": [0.9, 0.95]},
                   target_losses=[5.0, 4.5])
    cfg = parse_args([path, "--report_to", "none", "--optimizer_kwargs", '{"betas": [0.8, 0.9]}',
                      "--target_losses", "3"])
    assert cfg.training.report_to == []
    assert cfg.optim.kwargs() == {"betas": [0.8, 0.9]}
    assert cfg.bench.target_losses == [3.0]
    assert parse_args([_recipe(tmp_path, report_to="tensorboard")]).training.report_to == ["tensorboard"]


@pytest.mark.parametrize("recipe, cli, needle", [
    ({"max_steps": [1, 2]}, [], "max_steps in recipe"),  # a list for a one-value key
    ({"run_name": {"a": 1}}, [], "run_name in recipe"),  # a mapping for a one-value key (was: a JSON-string name)
    ({"target_losses": [4.0, "low"]}, [], "target_losses in recipe"),  # each element type-checked
    ({"report_to": ["tensorboard", "bogus"]}, [], "unknown integration 'bogus'"),
    ({"report_to": ["none", "tensorboard"]}, [], "cannot be combined"),
    ({}, ["--report_to", "tensorboard,bogus"], "unknown integration 'bogus'"),  # was: a Trainer traceback, exit 1
    ({}, ["--max_steps", "1", "2"], "unexpected value(s) on the command line: 2"),
    ({"eval_strategy": "sometimes"}, [], "eval_strategy in recipe"),  # choices checked for a recipe value too
])
def test_malformed_list_exits_2_before_anything_is_written(recipe: dict, cli: list[str], needle: str,
                                                           tmp_path: Path, monkeypatch, capsys) -> None:
    from hf_optbench import cli as cli_mod

    monkeypatch.chdir(tmp_path)
    path = _recipe(tmp_path, **recipe)
    before = sorted(tmp_path.rglob("*"))
    rc = cli_mod.main(["run", path, *cli])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert needle in err, err
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.slow
def test_a_run_reports_to_two_trackers_from_a_recipe(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    pytest.importorskip("tensorboard")
    from hf_optbench.run import train as run_mod

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    quick = yaml.safe_load(Path(RECIPES[0]).parent.joinpath("quickstart_cpu.yaml").read_text())
    quick.update(report_to=["tensorboard", "wandb"], max_steps=2, eval_steps=2, block_size=32, save_strategy="no",
                 write_model_card=False, output_dir=str(tmp_path / "run"))
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(quick))
    assert run_mod.main([str(tmp_path / "r.yaml")]) == 0
    assert list((tmp_path / "run").glob("runs/**/events.out.tfevents.*"))  # TensorBoard wrote
    assert list(tmp_path.glob("wandb/offline-run-*"))  # and W&B (offline)
