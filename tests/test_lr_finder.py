"""LR range test: exponential ramp, divergence stop, suggestions, weight restore, plot, CLI parsing."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_optbench.errors import OptBenchError
from hf_optbench.lr_finder import _split_own, find_lr_main, lr_range_test, suggest
from hf_optbench.optimizers import build_optimizer

from fixtures.models import tiny_model


def batches(n: int = 8) -> list[dict[str, torch.Tensor]]:
    """A learnable stream: each row repeats a short random pattern, so the loss can fall well below ln(128)."""
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 128, (4,), generator=g).repeat(4) for _ in range(4 * n)]
    return [{"input_ids": torch.stack(rows[4 * i:4 * i + 4])} for i in range(n)]


def test_ramp_is_exponential_stops_on_divergence_and_restores_weights():
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    res = lr_range_test(model, "adamw", batches(), min_lr=1e-4, max_lr=10.0, num_steps=40)
    ratios = np.diff(np.log(res.lrs))
    assert res.lrs[0] == pytest.approx(1e-4) and np.allclose(ratios, math.log(1e5) / 39)
    assert res.diverged_at_step is not None and len(res.lrs) == res.diverged_at_step + 1 < 40
    assert res.losses[-1] > 4 * min(res.losses[:-1])
    assert res.suggestion_steepest is not None and 1e-4 <= res.suggestion_steepest <= res.lrs[-1]
    assert res.suggestion_min_div10 == pytest.approx(res.lrs[int(np.argmin(res.losses))] / 10)
    assert res.losses[int(np.argmin(res.losses))] < res.losses[0] - 0.2  # the loss really fell first
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_smoothing_is_the_bias_corrected_ema():
    res = lr_range_test(tiny_model(), "sgd", batches(), min_lr=1e-6, max_lr=1e-5, num_steps=5, smooth=0.5)
    avg = 0.0
    for i, raw in enumerate(res.raw_losses):
        avg = 0.5 * avg + 0.5 * raw
        assert res.losses[i] == pytest.approx(avg / (1 - 0.5 ** (i + 1)))


def test_suggestions_on_a_known_curve():
    lrs = list(np.logspace(-6, 0, 61))
    x = np.log10(lrs)
    # falls fastest at lr=1e-3, lowest at 1e-2, blows up after
    loss = 5 - np.tanh(2 * (x + 3)) + np.where(x > -2, 40 * (x + 2) ** 2, 0)
    steep, min10 = suggest(lrs, list(loss))
    assert steep == pytest.approx(1e-3, rel=0.3)
    assert min10 == pytest.approx(lrs[int(np.argmin(loss))] / 10)
    assert suggest(lrs[:2], list(loss[:2])) == (None, None)


def test_groups_keep_their_ratio_and_special_optimizers_run():
    model = tiny_model()
    with pytest.warns(UserWarning, match="Conv1D"):
        opt = build_optimizer("muon", model, lr=1e-4, adjust_lr_fn="original", muon_lr=2e-3)
    lr_range_test(model, opt, batches(), min_lr=1e-4, max_lr=1e-3, num_steps=4)
    muon_lr, adamw_lr = opt.muon.param_groups[0]["lr"], opt.adamw.param_groups[0]["lr"]
    assert muon_lr / adamw_lr == pytest.approx(20.0) and adamw_lr == pytest.approx(1e-3)
    sophia_model = tiny_model()
    sophia = build_optimizer("sophia", sophia_model, lr=1e-4, update_period=2)
    lr_range_test(sophia_model, sophia, batches(), min_lr=1e-5, max_lr=1e-3, num_steps=5)
    assert sophia.param_groups[0]["gnb_updates"] == 2
    res = lr_range_test(tiny_model(), "schedule_free_adamw", batches(), min_lr=1e-5, max_lr=1e-2, num_steps=5)
    assert len(res.lrs) == 5


def test_plot_and_json(tmp_path):
    res = lr_range_test(tiny_model(), "lion", batches(), min_lr=1e-6, max_lr=1e-1, num_steps=15)
    png = res.plot(tmp_path / "lr.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    d = res.to_dict()
    assert set(d) >= {"lrs", "losses", "suggestion_steepest", "suggestion_min_div10", "settings"}


def test_bad_arguments_are_named():
    with pytest.raises(OptBenchError, match="min_lr"):
        lr_range_test(tiny_model(), "adamw", batches(), min_lr=1e-2, max_lr=1e-3)
    with pytest.raises(OptBenchError, match="ran out of batches"):
        lr_range_test(tiny_model(), "adamw", iter(batches(2)), min_lr=1e-5, max_lr=1e-3, num_steps=5)


def test_cli_options_are_split_from_recipe_overrides(capsys):
    own, rest = _split_own(["r.yaml", "--min-lr", "1e-6", "--max_steps", "5", "--num-steps=40", "--output", "o"])
    assert own == {"min_lr": 1e-6, "num_steps": 40, "output": "o"} and rest == ["r.yaml", "--max_steps", "5"]
    with pytest.raises(OptBenchError, match="--max-lr"):
        _split_own(["--max-lr", "big"])
    assert find_lr_main(["--help"]) == 0 and "find-lr RECIPE.yaml" in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("hf_optbench.data") is None, reason="data module not present yet")
def test_find_lr_end_to_end_on_the_quickstart_recipe(tmp_path):
    out = tmp_path / "lr"
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "quickstart_cpu.yaml"
    rc = find_lr_main([str(recipe), "--output_dir", str(tmp_path / "run"), "--num-steps", "20",
                       "--min-lr", "1e-5", "--max-lr", "1e-1", "--output", str(out)])
    assert rc == 0 and (out / "lr_finder.png").is_file()
    record = json.loads((out / "lr_finder.json").read_text())
    assert record["optimizer"] == "adamw" and len(record["lrs"]) >= 3 and record["default_learning_rate"] == 1e-3
