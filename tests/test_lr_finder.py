"""LR range test: exponential ramp, divergence stop, suggestions, weight restore, plot, CLI parsing."""

from __future__ import annotations

import importlib.util
import io
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hf_optbench.cli.find_lr import _output_dir, _Progress, _split_own
from hf_optbench.cli.find_lr import main as find_lr_main
from hf_optbench.errors import OptBenchError
from hf_optbench.optim.registry import build_optimizer
from hf_optbench.run.lr_finder import lr_range_test, suggest

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
    assert res.suggestion_min_div10 == pytest.approx(res.minimum_lr / 10)
    assert res.minimum_lr <= res.lrs[int(np.argmin(res.losses))]  # the zero-lag minimum: not later than the EMA's
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
    sug = suggest(lrs, list(loss))
    assert sug.steepest == pytest.approx(1e-3, rel=0.3)
    assert sug.minimum_lr == pytest.approx(1e-2, rel=0.3)  # one ramp step is 26%
    assert sug.min_div10 == pytest.approx(sug.minimum_lr / 10)
    assert sug.valley is not None and sug.valley < sug.steepest
    assert suggest(lrs[:4], list(loss[:4])).steepest is None
    assert suggest(lrs, [5.0] * 3 + [math.nan] * 58).min_div10 is None  # stopped at once: nothing to read


def _ema(raw: np.ndarray, beta: float = 0.98) -> np.ndarray:
    avg, out = 0.0, []
    for i, v in enumerate(raw):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta ** (i + 1)))
    return np.asarray(out)


def test_steepest_suggestion_sits_before_the_blow_up_not_on_it():
    """A curve shaped like recipes/quickstart_cpu.yaml's: flat, then falling faster and faster until the loss
    blows up at 2.5e-2. The 0.98 EMA lags, so its steepest slope sits on the blow-up (the old rule's 2.4e-2)."""
    lrs = np.logspace(-7, 0, 100)
    x = np.log10(lrs)
    onset = -1.6
    rng = np.random.default_rng(0)
    raw = np.where(x <= onset, 7.5 - 1.9 * np.exp(1.5 * (x - onset)), 5.6 + 30 * (x - onset))
    raw = raw + rng.normal(0, 0.01, raw.size)
    ema = _ema(raw)
    ema_min = int(np.argmin(ema))
    old_rule = int(np.argmin(np.gradient(ema[10:ema_min], x[10:ema_min]))) + 10
    assert lrs[old_rule] > 10 ** onset / 2  # the constructed curve reproduces the fault
    sug = suggest(list(lrs), list(raw))
    assert sug.steepest < lrs[ema_min] and sug.steepest < 10 ** onset / 2
    assert sug.minimum_lr <= 10 ** onset * 1.3 and sug.min_div10 < sug.steepest
    assert sug.valley < sug.steepest


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


def test_plot_and_json_and_progress(tmp_path):
    calls = []
    res = lr_range_test(tiny_model(), "lion", batches(), min_lr=1e-6, max_lr=1e-1, num_steps=15,
                        on_step=lambda *a: calls.append(a))
    assert [c[0] for c in calls] == list(range(len(res.lrs)))
    assert [c[1] for c in calls] == res.lrs and [c[3] for c in calls] == res.losses
    png = res.plot(tmp_path / "lr.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not list(tmp_path.glob("*.tmp*"))
    d = res.to_dict()
    assert set(d) >= {"lrs", "losses", "raw_losses", "zero_lag_losses", "suggestion_steepest",
                      "suggestion_min_div10", "suggestion_valley", "minimum_lr", "settings"}
    assert len(d["zero_lag_losses"]) == len(d["lrs"])


def test_plot_clips_the_blow_up_and_keeps_the_start_readable(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hf_optbench.run.lr_finder import _set_ylim

    lrs = list(np.logspace(-5, 0, 30))
    raw = [7.5 - 0.05 * i for i in range(20)] + [50.0 * (i + 1) for i in range(10)]
    fig, ax = plt.subplots()
    clipped = _set_ylim(ax, raw, raw, lrs, minimum_lr=lrs[19])
    lo, hi = ax.get_ylim()
    plt.close(fig)
    assert clipped and lo < min(raw) and 7.5 < hi < 50.0


def test_bad_arguments_are_named():
    with pytest.raises(OptBenchError, match="min_lr"):
        lr_range_test(tiny_model(), "adamw", batches(), min_lr=1e-2, max_lr=1e-3)
    with pytest.raises(OptBenchError, match="ran out of batches"):
        lr_range_test(tiny_model(), "adamw", iter(batches(2)), min_lr=1e-5, max_lr=1e-3, num_steps=5)


def test_cli_options_are_split_from_recipe_overrides(capsys):
    own, rest = _split_own(["r.yaml", "--min-lr", "1e-6", "--max_steps", "5", "--num-steps=40", "--output", "o"])
    assert own == {"min_lr": 1e-6, "num_steps": 40, "output": "o"} and rest == ["r.yaml", "--max_steps", "5"]
    with pytest.raises(OptBenchError, match="--max_lr"):
        _split_own(["--max-lr", "big"])
    assert find_lr_main(["--help"]) == 0 and "find-lr RECIPE.yaml" in capsys.readouterr().out


def test_progress_lines_every_n_steps_or_seconds():
    stream = io.StringIO()
    progress = _Progress(25, stream=stream)
    for step in range(25):
        progress(step, 1e-3 * (step + 1), 7.0, 7.1)
    lines = stream.getvalue().splitlines()
    assert [ln.split()[2] for ln in lines] == ["1/25", "11/25", "21/25", "25/25"]
    assert "lr 1.10e-02" in lines[1] and "loss 7.0000" in lines[1] and "smoothed 7.1000" in lines[1]
    clock = iter(float(6 * i) for i in range(100))
    slow = _Progress(25, stream=(stream := io.StringIO()))
    slow.clock = lambda: next(clock)
    for step in range(5):
        slow(step, 1e-3, 7.0, 7.0)
    assert len(stream.getvalue().splitlines()) == 5  # 6 s apart: every step gets a line


def test_output_folder_refuses_an_earlier_result_unless_overwrite(tmp_path):
    cfg = SimpleNamespace(training=SimpleNamespace(output_dir=str(tmp_path / "run")))
    assert _output_dir(cfg, {}) == tmp_path / "run" / "lr_finder"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "lr_finder.json").write_text("{}")
    with pytest.raises(OptBenchError, match="--overwrite"):
        _output_dir(cfg, {"output": str(tmp_path / "mine")})
    assert _output_dir(cfg, {"output": str(tmp_path / "mine"), "overwrite": True}) == tmp_path / "mine"
    assert _split_own(["r.yaml", "--overwrite"]) == ({"overwrite": True}, ["r.yaml"])


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


@pytest.mark.skipif(importlib.util.find_spec("hf_optbench.data.pipeline") is None, reason="data module not present yet")
def test_find_lr_runs_beside_a_finished_run_and_leaves_it_unchanged(tmp_path, capsys):
    from hf_optbench.cli import main as cli_main
    from hf_optbench.rundir import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE

    run = tmp_path / "run"
    (run / "checkpoint-100").mkdir(parents=True)
    (run / SUMMARY_FILE).write_text(json.dumps({"status": "completed", "final_eval_loss": 6.1}))
    (run / METRICS_FILE).write_text('{"step": 1, "loss": 7.5}\n')
    (run / CONFIG_FILE).write_text("optimizer: adamw\n")
    (run / "checkpoint-100" / "model.safetensors").write_bytes(b"weights")
    before = _snapshot(run)
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "quickstart_cpu.yaml"
    argv = ["find-lr", str(recipe), "--output_dir", str(run), "--num-steps", "12", "--min-lr", "1e-5", "--max-lr",
            "1e-1"]
    assert cli_main(argv) == 0
    captured = capsys.readouterr()
    assert "find-lr step    1/12" in captured.err and "find-lr step   12/12" in captured.err
    after = _snapshot(run)
    assert {k: v for k, v in after.items() if not k.startswith("lr_finder/")} == before
    assert sorted(k for k in after if k.startswith("lr_finder/")) == ["lr_finder/lr_finder.json",
                                                                      "lr_finder/lr_finder.png"]
    record = json.loads((run / "lr_finder" / "lr_finder.json").read_text())
    assert record["optimizer"] == "adamw" and len(record["lrs"]) == 12 and record["default_learning_rate"] == 1e-3
    assert "valley" in captured.out and "min/10" in captured.out
    # a second test into the same folder is refused (exit 2, names the flag) before any work; nothing changes
    assert cli_main(argv) == 2
    assert "--overwrite" in capsys.readouterr().err and _snapshot(run) == after
