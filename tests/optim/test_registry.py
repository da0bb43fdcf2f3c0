"""The optimizer registry: every entry builds and steps, GPT-3 groups, exact agreement with the libraries, cited
defaults, and errors that name the bad name/argument."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from hf_optbench.cli.optimizers import main as cli_main
from hf_optbench.errors import OptBenchError
from hf_optbench.optim.registry import (
    CITATIONS,
    OPTIMIZERS,
    build_optimizer,
    check_optimizer_kwargs,
    describe_optimizer,
    is_schedule_free,
    optimizer_callbacks,
    optimizer_defaults,
    resolve_optimizer_name,
    size_class_for_params,
    spec_of,
)
from hf_optbench.optim.spec import param_groups
from hf_optbench.optim.tuned import lookup_tuned

from fixtures.models import tiny_model

CPU_OK = [n for n, s in OPTIMIZERS.items() if not s.requires_cuda]
CUDA_ONLY = [n for n, s in OPTIMIZERS.items() if s.requires_cuda]
SIZES = ("tiny", "mini", "midi", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


def batch(seed: int = 1, vocab: int = 128) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (2, 16), generator=g)


def train_steps(model, opt, steps: int, seed: int = 1) -> list[float]:
    losses = []
    for i in range(steps):
        x = batch(seed + i, model.config.vocab_size)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", CPU_OK)
def test_every_cpu_optimizer_builds_and_steps(name):
    model = tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    opt = build_optimizer(name, model, model_size="tiny")
    if is_schedule_free(opt):
        opt.train()
    losses = train_steps(model, opt, 3)
    assert all(torch.isfinite(torch.tensor(losses)))
    changed = sum(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=False))
    assert changed == len(before), f"{name}: only {changed}/{len(before)} tensors moved"
    assert describe_optimizer(opt) and spec_of(opt).name == name
    assert not [k for k in vars(opt) if k.startswith("hf_optbench")]  # nothing stamped on the object
    d = optimizer_defaults(name, "tiny")
    assert opt.param_groups[0]["weight_decay"] == pytest.approx(d["weight_decay"])


@pytest.mark.parametrize("name", CUDA_ONLY)
def test_cuda_only_optimizers_refuse_cpu_with_a_clear_error(name):
    with pytest.raises(OptBenchError, match="CUDA"):
        build_optimizer(name, tiny_model(), model_size="tiny")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_optimizer_steps_on_cuda(name):
    model = tiny_model(vocab=256).cuda()
    opt = build_optimizer(name, model, model_size="tiny")
    if is_schedule_free(opt):
        opt.train()
    x = batch(vocab=256).cuda()
    for _ in range(2):
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_param_groups_decay_exactly_the_matrices_and_list_tied_weights_once():
    model = tiny_model()
    assert model.lm_head.weight is model.transformer.wte.weight
    groups = param_groups(model, 0.1)
    decay, no_decay = groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    # 2 layers x (c_attn, attn c_proj, c_fc, mlp c_proj) + wte + wpe
    assert len(decay["params"]) == 2 * 4 + 2
    named = {id(p): n for n, p in model.named_parameters()}
    assert {named[id(p)] for p in decay["params"]} == {n for n, p in model.named_parameters() if p.dim() >= 2}


def test_our_adamw_is_bit_identical_to_torch_adamw_with_the_same_groups():
    m1, m2 = tiny_model(), tiny_model()
    ours = build_optimizer("adamw", m1, model_size="gpt2")
    fused = bool(ours.defaults.get("fused"))
    ref = torch.optim.AdamW(param_groups(m2, 0.1), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=fused or None,
                            foreach=None if fused else True)
    train_steps(m1, ours, 20)
    train_steps(m2, ref, 20)
    for (n, a), b in zip(m1.named_parameters(), m2.parameters(), strict=False):
        assert torch.equal(a, b), n


def test_adamw_chooses_fused_on_cpu_and_honours_an_explicit_choice():
    assert build_optimizer("adamw", tiny_model(), model_size="tiny").defaults["fused"] is True
    opt = build_optimizer("adamw", tiny_model(), model_size="tiny", fused=False, foreach=True)
    assert opt.defaults["foreach"] is True and not opt.defaults["fused"]
    assert describe_optimizer(opt) == "torch.optim.AdamW(foreach=True)"


def test_our_lion_matches_lion_pytorch():
    from lion_pytorch import Lion

    m1, m2 = tiny_model(), tiny_model()
    ours = build_optimizer("lion", m1, model_size="gpt2")
    ref = Lion(param_groups(m2, 0.3), lr=2e-4, betas=(0.9, 0.99))
    train_steps(m1, ours, 20)
    train_steps(m2, ref, 20)
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters(), strict=False))


def test_lion_foreach_follows_the_same_update_as_lion_pytorch():
    """lion_pytorch.foreach uses lerp where the loop uses mul+add: equal up to float rounding, and sign flips only
    where the interpolated momentum is ~0, so after 20 steps the weights agree to a few LR-sized steps at most."""
    from lion_pytorch import Lion

    m1, m2 = tiny_model(), tiny_model()
    fe = build_optimizer("lion_foreach", m1, lr=1e-3, weight_decay=0.3)
    ref = Lion(param_groups(m2, 0.3), lr=1e-3, betas=(0.9, 0.99))
    train_steps(m1, fe, 20)
    train_steps(m2, ref, 20)
    total = diff = 0
    for a, b in zip(m1.parameters(), m2.parameters(), strict=False):
        close = torch.isclose(a, b, rtol=0, atol=1e-6)
        total += a.numel()
        diff += int((~close).sum())
        assert (a - b).abs().max() <= 2 * 20 * 1e-3  # a flipped sign moves a weight by 2 lr per step
    assert diff / total < 1e-3


def test_unknown_optimizer_lists_the_registry_and_suggests():
    with pytest.raises(OptBenchError) as err:
        resolve_optimizer_name("adamww")
    msg = str(err.value)
    assert "Did you mean 'adamw'" in msg and all(n in msg for n in OPTIMIZERS)
    with pytest.raises(OptBenchError, match="Choose one of"):
        build_optimizer("nadam_plus", tiny_model())


def test_misspelled_kwarg_is_named_never_dropped():
    with pytest.raises(OptBenchError, match="'beta' .*Did you mean 'betas'"):
        build_optimizer("adamw", tiny_model(), model_size="tiny", beta=(0.9, 0.9))
    with pytest.raises(OptBenchError, match="'relative_step'"):
        check_optimizer_kwargs("adafactor", {"relative_step": True})
    with pytest.raises(OptBenchError, match="learning_rate"):
        check_optimizer_kwargs("lion", {"lr": 1e-4})
    with pytest.raises(OptBenchError, match="'momentun'.*Did you mean 'momentum'"):
        build_optimizer("torch.optim.SGD", tiny_model(), lr=0.1, momentun=0.9)


@pytest.mark.parametrize("size", SIZES)
def test_every_default_has_a_source(size):
    for name in OPTIMIZERS:
        d = optimizer_defaults(name, size)
        values = {k for k in d if k not in ("sources", "source", "size_class")}
        assert values == set(d["sources"]), name
        assert all(part in CITATIONS.values() for src in d["sources"].values() for part in src.split(" | "))
        assert d["learning_rate"] > 0 and d["weight_decay"] >= 0 and d["max_grad_norm"] == 1.0


def test_gpt3_adamw_values_and_the_lion_rule():
    expected = {"gpt2": 6e-4, "gpt2-medium": 3e-4, "gpt2-large": 2.5e-4, "gpt2-xl": 2e-4, "gpt2-base": 6e-4}
    for size, lr in expected.items():
        d = optimizer_defaults("adamw", size)
        assert (d["learning_rate"], d["weight_decay"], d["betas"], d["eps"]) == (lr, 0.1, (0.9, 0.95), 1e-8)
        assert "Brown et al. 2020" in d["sources"]["learning_rate"]
        assert not {"warmup_tokens", "warmup_steps"} & set(d)  # runs warm up over warmup_steps (10 % by default)
        lion = optimizer_defaults("lion", size)
        assert lion["learning_rate"] == pytest.approx(lr / 3, rel=1e-2)
        assert lion["weight_decay"] == pytest.approx(0.3) and lion["betas"] == (0.9, 0.99)
    tiny = optimizer_defaults("adamw", "tiny")
    assert tiny["learning_rate"] == 1e-3 and "nanoGPT" in tiny["source"]

def test_sophia_defaults_are_one_commit_of_its_repository_and_about_adamw_elsewhere():
    """Liuhong99/Sophia@a7e1572: README table = config/train_gpt2_*_sophiag.py; outside it, lr = AdamW's."""
    table = {"gpt2": (6e-4, 0.05), "gpt2-medium": (7e-4, 0.08), "gpt2-large": (3e-4, 0.05)}
    for size, (lr, rho) in table.items():
        d = optimizer_defaults("sophia", size)
        assert (d["learning_rate"], d["rho"], d["weight_decay"], d["betas"]) == (lr, rho, 0.2, (0.965, 0.99))
        assert "Liuhong99/Sophia@a7e1572" in d["sources"]["rho"]
    for size in ("tiny", "mini", "midi", "gpt2-xl"):
        d = optimizer_defaults("sophia", size)
        assert d["learning_rate"] == optimizer_defaults("adamw", size)["learning_rate"] and d["rho"] == 0.05


def test_defaults_reach_the_optimizer_and_explicit_values_win():
    opt = build_optimizer("sophia", tiny_model(), model_size="gpt2-medium")
    g = opt.param_groups[0]
    assert (g["lr"], g["weight_decay"], g["betas"], g["rho"]) == (7e-4, 0.2, (0.965, 0.99), 0.08)
    opt = build_optimizer("lion", tiny_model(), lr=1e-5, weight_decay=0.0, model_size="gpt2", betas=[0.95, 0.98])
    assert (opt.param_groups[0]["lr"], opt.param_groups[0]["weight_decay"]) == (1e-5, 0.0)
    assert opt.param_groups[0]["betas"] == (0.95, 0.98)


def test_model_size_is_inferred_from_the_parameter_count():
    assert size_class_for_params(5e6) == "cpu"
    assert size_class_for_params(124e6) == "125M" and size_class_for_params(1.5e9) == "1.3B"
    assert build_optimizer("adamw", tiny_model()).param_groups[0]["lr"] == 1e-3


def test_dotted_paths_build_and_need_an_lr():
    opt = build_optimizer("torch.optim.RAdam", tiny_model(), lr=1e-3, weight_decay=0.05, decoupled_weight_decay=True)
    assert isinstance(opt, torch.optim.RAdam) and describe_optimizer(opt) == "torch.optim.radam.RAdam"
    assert [g["weight_decay"] for g in opt.param_groups] == [0.05, 0.0]
    with pytest.raises(OptBenchError, match="set learning_rate"):
        build_optimizer("torch.optim.RAdam", tiny_model())
    with pytest.raises(OptBenchError, match="not installed"):
        resolve_optimizer_name("no_such_pkg.Optim")
    opt = build_optimizer("pytorch_optimizer.AdaBelief", tiny_model(), lr=1e-3)
    train_steps(tiny_model(), opt, 1)  # builds; stepping another model's grads is a no-op


def test_bnb_embedding_state_is_32_bit_unless_asked():
    for keep, want in ((True, torch.float32), (False, torch.uint8)):
        model = tiny_model(vocab=256)  # wte 256x32 = 8192 elements > bnb's min_8bit_size 4096
        opt = build_optimizer("adamw_8bit", model, model_size="tiny", embedding_state_32bit=keep)
        assert describe_optimizer(opt, model=model).endswith("not yet stepped)")  # nothing measured yet
        train_steps(model, opt, 1)
        assert opt.state[model.transformer.wte.weight]["state1"].dtype == want
        assert opt.state[model.transformer.h[0].mlp.c_fc.weight]["state1"].dtype == torch.uint8
        assert ("embedding fp32" if keep else "embedding 8-bit") in describe_optimizer(opt, model=model)


def test_lion_triton_is_refused_without_cuda_instead_of_exiting():
    with pytest.raises(OptBenchError, match="use_triton"):
        build_optimizer("lion", tiny_model(), model_size="tiny", use_triton=True)


def test_schedule_free_and_sophia_come_with_their_callbacks():
    from hf_optbench.optim.schedule_free_impl import ScheduleFreeModeCallback
    from hf_optbench.optim.sophia_impl import SophiaGHessianCallback

    assert is_schedule_free("schedule_free_adamw") and is_schedule_free("adamw_schedulefree")
    assert not is_schedule_free("adamw") and not is_schedule_free("torch.optim.RAdam")
    sf = build_optimizer("schedule_free_adamw", tiny_model(), model_size="tiny")
    assert is_schedule_free(sf)
    assert [type(c) for c in optimizer_callbacks(sf)] == [ScheduleFreeModeCallback]
    sophia = build_optimizer("sophia", tiny_model(), model_size="tiny")
    assert [type(c) for c in optimizer_callbacks(sophia)] == [SophiaGHessianCallback]
    assert optimizer_callbacks(build_optimizer("adamw", tiny_model())) == []

    class Wrapper:  # what Accelerate hands to callbacks
        def __init__(self, opt):
            self.optimizer = opt

        @property
        def param_groups(self):
            return self.optimizer.param_groups

    assert is_schedule_free(Wrapper(sf)) and describe_optimizer(Wrapper(sophia)).startswith("hf_optbench.optim.sophia")


def test_lookup_tuned_reads_yaml_and_json_with_aliases(tmp_path):
    y = tmp_path / "tuned.yaml"
    y.write_text("adamw_torch:\n  gpt2-base: {learning_rate: 0.0012, eval_loss: 3.1}\nlion:\n  tiny: {learning_rate: 3e-4}\n")
    assert lookup_tuned(str(y), "adamw", "gpt2") == {"learning_rate": 0.0012, "eval_loss": 3.1}
    assert lookup_tuned(str(y), "lion", "tiny") == {"learning_rate": 3e-4}
    assert lookup_tuned(str(y), "lion", "gpt2") == {}
    j = tmp_path / "tuned.json"
    j.write_text(json.dumps({"muon": {"mini": {"learning_rate": 0.002}}}))
    assert lookup_tuned(str(j), "muon", "mini") == {"learning_rate": 0.002}
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just a list\n")
    with pytest.raises(OptBenchError, match="must map"):
        lookup_tuned(str(bad), "adamw", "gpt2")


def test_cli_lists_names_defaults_and_sources(capsys):
    assert cli_main(["--size", "gpt2-medium"]) == 0
    out = capsys.readouterr().out
    assert all(n in out for n in OPTIMIZERS) and "0.0003" in out and "Brown et al. 2020" in out
    assert cli_main(["--json", "--size", "tiny"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in data["optimizers"]} == set(OPTIMIZERS)
    assert data["optimizers"][0]["defaults"]["sources"]


def test_registry_and_config_import_no_torch():
    code = ("import sys, hf_optbench.optim.registry, hf_optbench.config.optim_args, hf_optbench.optim.schedules; "
            "print(any(m == 'torch' or m.startswith('torch.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_optimizer_arguments_parse_and_validate_json():
    from hf_optbench.config.optim_args import OptimizerArguments

    a = OptimizerArguments(optimizer="AdamW_torch", optimizer_kwargs='{"betas": [0.9, 0.98]}',
                           schedule="wsd", schedule_kwargs='{"decay_ratio": 0.1}')
    assert a.optimizer == "adamw" and a.kwargs() == {"betas": [0.9, 0.98]}
    assert a.schedule_kwargs_dict() == {"decay_ratio": 0.1}
    with pytest.raises(OptBenchError, match="optimizer_kwargs is not valid JSON"):
        OptimizerArguments(optimizer_kwargs="{betas: 1}")
    with pytest.raises(OptBenchError, match="'bettas'"):
        OptimizerArguments(optimizer_kwargs='{"bettas": [0.9, 0.9]}')
    with pytest.raises(OptBenchError, match="decay_ratio"):
        OptimizerArguments(schedule="gpt3_cosine", schedule_kwargs='{"decay_ratio": 0.1}')
    with pytest.raises(OptBenchError, match="min_lr_ratio"):
        OptimizerArguments(min_lr_ratio=1.5)
    with pytest.raises(OptBenchError, match="does not exist"):
        OptimizerArguments(tuned_hparams_file="/nonexistent/tuned.yaml")
    import dataclasses

    from transformers import TrainingArguments

    clash = {f.name for f in dataclasses.fields(OptimizerArguments)} & {f.name for f in dataclasses.fields(TrainingArguments)}
    assert not clash


def test_optimizer_arguments_go_through_hf_argument_parser(tmp_path):
    from transformers import HfArgumentParser

    from hf_optbench.config.optim_args import OptimizerArguments

    tuned = tmp_path / "t.yaml"
    tuned.write_text("adamw: {}\n")
    (a,) = HfArgumentParser((OptimizerArguments,)).parse_args_into_dataclasses(
        ["--optimizer", "lion", "--optimizer_kwargs", '{"betas": [0.95, 0.98]}', "--schedule", "one_cycle",
         "--embedding_state_32bit", "false", "--tuned_hparams_file", str(tuned), "--min_lr_ratio", "0.05"])
    assert (a.optimizer, a.schedule, a.embedding_state_32bit, a.min_lr_ratio) == ("lion", "one_cycle", False, 0.05)
    assert a.kwargs() == {"betas": [0.95, 0.98]} and a.tuned_hparams_file == str(tuned)


def test_lr_grid_brackets_the_default():
    from hf_optbench.optim.registry import lr_grid

    assert lr_grid("adamw", "gpt2") == [1.5e-4, 3e-4, 6e-4, 1.2e-3, 2.4e-3]
    assert lr_grid("lion", "gpt2-medium", factors=(0.5, 1.0, 2.0)) == [5e-5, 1e-4, 2e-4]


@pytest.mark.parametrize("eight_bit, base", [("adamw_8bit", "adamw"), ("lion_8bit", "lion"),
                                             ("paged_adamw_8bit", "adamw"), ("paged_lion_8bit", "lion")])
def test_8bit_defaults_are_the_32bit_values_and_cite_both_sources(eight_bit: str, base: str) -> None:
    d8, d32 = optimizer_defaults(eight_bit, "gpt2"), optimizer_defaults(base, "gpt2")
    values = {k: v for k, v in d8.items() if k not in ("source", "sources", "size_class")}
    assert values == {k: v for k, v in d32.items() if k not in ("source", "sources", "size_class")}
    assert d8["source"] == f"{d32['source']} | {CITATIONS['bnb8bit']}"
    assert all(d8["sources"][k] == f"{d32['sources'][k]} | {CITATIONS['bnb8bit']}" for k in d32["sources"])
