"""No TrainingArguments field is accepted and then ignored (issue 14 item 1): the optimizer/schedule fields the stock
Trainer would read are either honoured (adam_* for the AdamW family, learning_rate, ...) or refused naming the
hf_optbench key to use."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import yaml

from hf_optbench.config.checks import ADAM_KEYS, HONOURED_TRAINING_KEYS, REPLACED_TRAINING_KEYS, adam_family
from hf_optbench.config.parse import parse_args
from hf_optbench.config.trainer_keys import SPELLINGS
from hf_optbench.errors import OptBenchError
from hf_optbench.optim.registry import OPTIMIZERS, build_resolved, optimizer_defaults
from hf_optbench.run.plan import Sourced, resolve_optimization


def _recipe(tmp_path: Path, **values) -> str:
    path = tmp_path / "r.yaml"
    base = {"model_size": "tiny", "max_steps": 5, "output_dir": str(tmp_path / "run"), "use_cpu": True}
    path.write_text(yaml.safe_dump({**base, **values}))
    return str(path)


def test_adam_arguments_reach_the_built_adamw(tmp_path: Path) -> None:
    """adam_beta2 / adam_epsilon become the AdamW family's constructor values in the run's plan, with source "user"
    (the parsed arguments are not rewritten), and the optimizer built from the plan holds them."""
    from fixtures.models import tiny_model

    cfg = parse_args([_recipe(tmp_path), "--adam_beta2", "0.5", "--adam_epsilon", "1e-3"])
    cited_beta1 = optimizer_defaults("adamw", "tiny")["betas"][0]
    assert cfg.optim.kwargs() == {} and cfg.optim.optimizer_kwargs == "{}"  # nothing written back
    opt_plan = resolve_optimization(cfg)[0]
    assert opt_plan.constructor["betas"] == Sourced((cited_beta1, 0.5), "user")
    assert opt_plan.constructor["eps"] == Sourced(1e-3, "user")
    opt, _ = build_resolved(opt_plan.spec, tiny_model(), lr=1e-3, weight_decay=0.1,
                            ctor=opt_plan.constructor_values())
    assert all(g["betas"] == (cited_beta1, 0.5) and g["eps"] == 1e-3 for g in opt.param_groups)


def test_unset_adam_arguments_keep_the_cited_values(tmp_path: Path) -> None:
    cfg = parse_args([_recipe(tmp_path)])
    assert cfg.optim.kwargs() == {}
    cited = optimizer_defaults("adamw", "tiny")
    betas = resolve_optimization(cfg)[0].constructor["betas"]
    assert betas.value == cited["betas"] and betas.source == cited["sources"]["betas"]


@pytest.mark.parametrize("name", adam_family())
def test_every_adamw_variant_takes_adam_beta1(tmp_path: Path, name: str) -> None:
    cfg = parse_args([_recipe(tmp_path), "--optimizer", name, "--adam_beta1", "0.8"])
    betas = resolve_optimization(cfg)[0].constructor["betas"]
    assert betas == Sourced((0.8, optimizer_defaults(name, "tiny")["betas"][1]), "user")


def test_adam_family_is_the_adamw_variants() -> None:
    assert set(adam_family()) == {"adamw", "adamw_8bit", "paged_adamw_8bit", "schedule_free_adamw"}


@pytest.mark.parametrize("name", [n for n in OPTIMIZERS if n not in adam_family()] + ["torch.optim.RAdam"])
@pytest.mark.parametrize("key", sorted(ADAM_KEYS))
def test_adam_arguments_are_refused_where_they_would_be_ignored(tmp_path: Path, name: str, key: str) -> None:
    with pytest.raises(OptBenchError, match=f"'{key}'.*optimizer_kwargs"):
        parse_args([_recipe(tmp_path), "--optimizer", name, "--learning_rate", "1e-3", f"--{key}", "0.5"])


# A value of the right type for each replaced field (the refusal must come from the key, not a type error).
REPLACED_VALUES = {"optim_args": "betas=0.9", "optim_target_modules": "attn", "auto_find_batch_size": "true"}
REPLACED_BY = {"optim_args": "optimizer_kwargs", "optim_target_modules": "remove it",
               "auto_find_batch_size": "per_device_train_batch_size"}


@pytest.mark.parametrize("key", sorted(REPLACED_TRAINING_KEYS))
@pytest.mark.parametrize("where", ["cli", "recipe"])
def test_replaced_fields_are_refused_naming_the_key_to_use(tmp_path: Path, key: str, where: str) -> None:
    assert set(REPLACED_VALUES) == set(REPLACED_TRAINING_KEYS)
    if where == "cli":
        argv = [_recipe(tmp_path), f"--{key}", REPLACED_VALUES[key]]
    else:
        argv = [_recipe(tmp_path, **{key: yaml.safe_load(REPLACED_VALUES[key])})]
    with pytest.raises(OptBenchError, match=f"'{key}'.*{REPLACED_BY[key]}"):
        parse_args(argv)


def _fields_read(path: Path, functions: set[str] | None) -> set[str]:
    """Attribute names read as ``args.X`` / ``self.args.X`` / ``ctx.args.X`` in ``functions`` of a module (all of
    it when None)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    scopes = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in functions] \
        if functions is not None else [tree]
    found = set()
    for scope in scopes:
        for node in ast.walk(scope):
            if isinstance(node, ast.Attribute) and (
                (isinstance(node.value, ast.Name) and node.value.id == "args")
                or (isinstance(node.value, ast.Attribute) and node.value.attr == "args")
            ):
                found.add(node.attr)
    return found


def test_every_optimizer_field_the_stock_trainer_reads_is_honoured_or_refused() -> None:
    """The fields transformers' create_optimizer / create_scheduler / get_optimizer_cls_and_kwargs (and the
    optimizer handlers of trainer_optimizer.py) read: we pass our own (optimizer, scheduler), so each must be
    honoured by our run or refused at parse time. A transformers upgrade adding one fails here."""
    import transformers
    from transformers import TrainingArguments

    pkg = Path(transformers.__file__).parent
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    read = _fields_read(pkg / "trainer.py", {"create_optimizer", "create_scheduler", "get_optimizer_cls_and_kwargs"})
    if (pkg / "trainer_optimizer.py").is_file():
        read |= _fields_read(pkg / "trainer_optimizer.py", None)
    read &= fields
    assert {"optim", "adam_beta2", "lr_scheduler_type"} <= read  # the scan sees what it should
    handled = set(REPLACED_TRAINING_KEYS) | set(ADAM_KEYS) | set(HONOURED_TRAINING_KEYS) | set(SPELLINGS)
    assert read <= handled, f"neither honoured nor refused: {sorted(read - handled)}"
