"""benchmarks/: the probes measure what they claim, and the scripts run end to end on tiny settings (so the
README's rerun commands keep working). Timings themselves are not asserted here: this machine is too noisy for
that; the benchmarks report them as ratios measured within one run."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import callback_probes  # noqa: E402
import pinned_malloc  # noqa: E402


class _Log(TrainerCallback):
    def __init__(self, sleep: float = 0.0) -> None:
        self.calls: list[tuple[str, int]] = []
        self.sleep = sleep

    def _note(self, name: str, state: TrainerState) -> None:
        self.calls.append((name, state.global_step))
        time.sleep(self.sleep)

    def on_train_begin(self, args, state, control, **kw):
        self._note("train_begin", state)

    def on_step_begin(self, args, state, control, **kw):
        self._note("step_begin", state)

    def on_step_end(self, args, state, control, **kw):
        self._note("step_end", state)

    def on_log(self, args, state, control, **kw):
        self._note("log", state)


def _json_out(text: str):
    """The JSON a benchmark printed, after any library start-up chatter on stdout (DeepSpeed's accelerator line)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line in ("[", "{"))
    return json.loads("\n".join(lines[start:]))


def _drive(cb: TrainerCallback, steps: int) -> None:
    """The event order of Trainer's loop: train begin, then per step begin, end (global_step advanced), log."""
    state, control = TrainerState(), TrainerControl()
    cb.on_train_begin(None, state, control)
    for step in range(1, steps + 1):
        cb.on_step_begin(None, state, control)
        state.global_step = step
        cb.on_step_end(None, state, control)
        cb.on_log(None, state, control, logs={"loss": 1.0})
    cb.on_train_end(None, state, control)


def test_every_other_step_forwards_whole_even_intervals_only():
    inner = _Log()
    _drive(callback_probes.EveryOtherStep(inner), steps=6)
    # interval N = step N-1's log + step N's begin/end; even intervals are forwarded, train begin always
    assert inner.calls == [
        ("train_begin", 0),
        ("log", 1), ("step_begin", 1), ("step_end", 2),
        ("log", 3), ("step_begin", 3), ("step_end", 4),
        ("log", 5), ("step_begin", 5), ("step_end", 6),
    ]


def test_split_toggled_pairs_interval_parity_with_the_gate():
    # index i is the interval ending at step i + 2: even i -> even interval -> the gate forwarded it
    assert callback_probes.split_toggled([10, 20, 11, 21, 12, 22], skip=2) == {"on": [11, 12], "off": [21, 22]}


def test_self_timer_opens_one_entry_per_step_across_callbacks():
    timer = callback_probes.SelfTimer()
    a, b = timer.wrap(_Log(sleep=0.002)), timer.wrap(_Log(sleep=0.001))
    state, control = TrainerState(), TrainerControl()
    a.on_train_begin(None, state, control)
    for step in range(1, 4):
        for cb in (a, b):
            cb.on_step_begin(None, state, control)
        state.global_step = step
        for cb in (a, b):
            cb.on_step_end(None, state, control)
    assert len(timer.per_step) == 3  # b's step begin did not open entries of its own
    assert all(t >= 2 * (0.002 + 0.001) for t in timer.per_step)  # both callbacks' begin and end counted
    assert len(timer.once) == 1 and timer.once[0] >= 0.002
    assert [c[0] for c in a.calls].count("step_end") == 3  # the wrapped methods still ran


def test_malloc_pin_reexecs_once_with_the_pinned_tunables(monkeypatch):
    seen = []
    monkeypatch.setattr(pinned_malloc.os, "execve", lambda exe, argv, env: seen.append((exe, argv, env)))
    monkeypatch.setattr(pinned_malloc.platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.cpu.x86_shstk=0")
    assert pinned_malloc.malloc_setting() == "default"
    pinned_malloc.reexec_pinned("bench.py", ["--rounds", "1"])
    (exe, argv, env), = seen
    assert argv == [sys.executable, "bench.py", "--rounds", "1"]
    assert env["GLIBC_TUNABLES"] == "glibc.cpu.x86_shstk=0:" + pinned_malloc.PINNED  # the user's tunable kept

    monkeypatch.setenv("GLIBC_TUNABLES", env["GLIBC_TUNABLES"])
    assert pinned_malloc.malloc_setting() == "pinned"
    pinned_malloc.reexec_pinned("bench.py", [])
    monkeypatch.setattr(pinned_malloc.platform, "libc_ver", lambda: ("musl", ""))
    monkeypatch.delenv("GLIBC_TUNABLES")
    assert pinned_malloc.malloc_setting() == "n/a (not glibc)"
    pinned_malloc.reexec_pinned("bench.py", [])
    assert len(seen) == 1  # neither an already pinned process nor a non-glibc one is re-executed


def test_bench_harness_measures_all_variants_and_our_own_time(capsys):
    import bench_harness

    steps, skip = 8, 1
    assert bench_harness.main(["--shapes", "tiny-b1-s16", "--rounds", "1", "--steps", str(steps), "--skip",
                               str(skip), "--logging-steps", "1", "--malloc", "default", "--json"]) == 0
    (res,) = _json_out(capsys.readouterr().out)
    assert res["steps_measured"] == {"plain": steps - skip, "trainer": steps - skip, "hf_optbench": steps - skip}
    assert all(v > 0 for v in res["median_step_ms"].values())
    assert all(len(v) == 1 for v in res["median_step_ms_per_round"].values())
    ours = res["ours_on_top_ms"]
    assert sum(ours["toggled_steps"].values()) == steps - 1 - skip and min(ours["toggled_steps"].values()) > 0
    assert 0 < ours["self_median"] < res["median_step_ms"]["hf_optbench"]  # our callbacks ran and were timed


def test_bench_harness_syncs_every_logging_steps_on_both_sides_at_the_demo_shape(capsys):
    """--logging-steps 4: both sides' step times come from whole 4-step intervals between syncs (the first
    interval, holding the warm-up step, dropped); no toggled figure (it needs a sync every step)."""
    import bench_harness

    assert bench_harness.main(["--shapes", "demo", "--rounds", "1", "--steps", "8", "--skip", "1",
                               "--logging-steps", "4", "--malloc", "default", "--json"]) == 0
    (res,) = _json_out(capsys.readouterr().out)
    assert (res["micro_batch"], res["block_size"], res["vocab"], res["logging_steps"]) == (4, 64, 32, 4)
    assert res["steps_measured"] == {"plain": 4, "trainer": 4, "hf_optbench": 4}
    assert res["ours_on_top_ms"]["toggled"] is None and res["ratio_per_round"]["median"] > 0


def test_bench_harness_help_is_whole(capsys):
    import bench_harness

    with pytest.raises(SystemExit):
        bench_harness.main(["--help"])
    text = capsys.readouterr().out
    assert "malloc thresholds pinned (pinned_malloc.py)." in text and "--logging-steps" in text
    assert "at most 1.10" in text


def test_bench_callbacks_runs(capsys):
    import bench_callbacks

    assert bench_callbacks.main(["--rounds", "1", "--steps", "8", "--skip", "1", "--vocab", "128", "--json"]) == 0
    res = _json_out(capsys.readouterr().out)
    assert res["toggled_steps"]["steps"]["on"] > 0 and res["toggled_steps"]["steps"]["off"] > 0
    assert res["self_time"]["median_us_per_step"] > 0


def test_bench_gpu_mfu_code_path_runs_on_cpu(tmp_path, capsys):
    import bench_gpu_mfu

    out = tmp_path / "rows.json"
    assert bench_gpu_mfu.main(["--device", "cpu", "--sizes", "tiny", "--batch", "2", "--block", "32", "--steps", "3",
                               "--rounds", "1", "--no-compile", "--dtype", "fp32", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["variant"] for r in rows] == ["plain", "hf_optbench"]
    assert all(r["tokens_per_s"] > 0 and r["mfu"] is None for r in rows)  # no peak is listed for a CPU
    assert rows[1]["ratio_vs_plain"] > 0
    assert "| tiny | hf_optbench | 2 x 32 |" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_gpu_mfu_compiled_bf16_path_runs_on_cpu(tmp_path):
    """What the GPU run sets (bf16 autocast in the loop, Trainer bf16=True + torch_compile=True) on the CPU: the
    nearest check of the GPU path on a machine without one. Both variants go through dynamo and AOT autograd in bf16
    (backend aot_eager); inductor's code generation for a CPU (C++ kernels, not a GPU's Triton) is left out: with a
    cold cache it took 40 s alone and 63 s in the suite, most of it compiling C++."""
    import bench_gpu_mfu

    out = tmp_path / "rows.json"
    assert bench_gpu_mfu.main(["--device", "cpu", "--sizes", "tiny", "--batch", "2", "--block", "32", "--steps", "2",
                               "--rounds", "1", "--dtype", "bf16", "--compile-backend", "aot_eager",
                               "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["variant"] for r in rows] == ["plain", "hf_optbench"]
    assert all(r["compile"] and r["compile_backend"] == "aot_eager" and r["dtype"] == "bf16" and r["tokens_per_s"] > 0
               for r in rows)


def test_the_run_takes_the_compile_backend_only_when_it_compiles():
    import run_path

    def flags(**kw):
        argv = run_path.run_args("tiny", 2, 32, 64, 4, 1, "/nonexistent", **kw)
        return dict(zip(argv[::2], argv[1::2], strict=True))

    assert flags(compile_=True, compile_backend="aot_eager")["--torch_compile_backend"] == "aot_eager"
    assert flags(compile_=True)["--torch_compile_backend"] == "inductor"  # TrainingArguments' own default
    assert "--torch_compile_backend" not in flags() and flags()["--torch_compile"] == "false"


def test_bench_gpu_mfu_cpu_needs_an_explicit_batch():
    import bench_gpu_mfu

    with pytest.raises(SystemExit):
        bench_gpu_mfu.main(["--device", "cpu", "--sizes", "tiny"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this checks the no-GPU path")
def test_bench_gpu_mfu_says_skipped_without_cuda(capsys):
    import bench_gpu_mfu

    assert bench_gpu_mfu.main([]) == 0
    assert capsys.readouterr().out.startswith("skipped: no CUDA device")


@pytest.mark.gpu
def test_bench_gpu_mfu_on_cuda_reports_mfu(tmp_path):
    import bench_gpu_mfu

    out = tmp_path / "rows.json"
    assert bench_gpu_mfu.main(["--sizes", "gpt2", "--block", "256", "--batch", "8", "--steps", "5", "--rounds", "1",
                               "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert all(r["max_allocated_gib"] > 0 for r in rows)
    if any(r["mfu"] is None for r in rows):
        pytest.skip(f"{rows[0]['device']} is not in hf_optbench.measure.metrics.DEVICE_PEAK_FLOPS")
    assert all(0 < r["mfu"] < 1 for r in rows)


def test_bench_startup_runs(capsys):
    import bench_startup

    assert bench_startup.main(["--repeats", "1", "--json"]) == 0
    rows = {r["command"]: r for r in _json_out(capsys.readouterr().out)}
    assert rows["hf-optbench --help"]["heavy_modules_imported"] == ""  # the start-up target's premise
    assert rows["hf-optbench validate RECIPE"]["heavy_modules_imported"] == ""


@pytest.mark.slow
def test_profile_run_counts_one_name_resolution_and_nothing_stamped(capsys):
    """benchmarks/profile_run.py, the measure of issue 30, on a 2-step quickstart run: the optimizer's name resolved
    once, the recipe read once, one plan, and no hf_optbench_* attribute on the optimizer or the scheduler."""
    import profile_run

    recipe = str(BENCH.parent / "recipes" / "quickstart_cpu.yaml")
    assert profile_run.main(["--json", "--", recipe, "--max_steps", "2", "--save_strategy", "no",
                             "--write_model_card", "false"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["calls"]["resolve_optimizer_name"] == got["calls"]["load_recipe"] == got["calls"]["resolve_plan"] == 1
    assert got["stamped_attributes"] == [] and got["functions_run"] > 0


@pytest.mark.slow
def test_bench_muon_step_measures_every_row_in_each_environment(tmp_path):
    """Both environments in children of their own: the native one as torch reports it, the AVX2 one with no native
    bf16 (so auto picks fp32, saying it is emulated), every row measured by both Newton-Schulz paths (per-matrix
    before, batched after), the tables written."""
    import bench_muon_step

    from hf_optbench.optim.muon_precision import bf16_matmul_native

    assert bench_muon_step.main(["--sizes", "tiny", "--rounds", "1", "--steps", "2", "--warmup", "1",
                                 "--out", str(tmp_path)]) == 0
    results = {r["env"]: r for r in json.loads((tmp_path / "muon_step.json").read_text())["results"]}
    assert results["avx2"]["bf16_native"] is False and results["avx2"]["auto"]["tiny"]["precision"] == "fp32"
    assert "bf16 native False" in results["avx2"]["auto"]["tiny"]["reason"]
    assert results["native"]["bf16_native"] == bf16_matmul_native("cpu")[0]
    for res in results.values():
        assert {(r["optimizer"], r["ns_precision"], r["path"]) for r in res["rows"]} == {
            ("adamw", None, None), *(("muon", p, path) for p in ("bf16", "fp32") for path in ("per-matrix", "batched"))}
        assert all(r["step_time_median_s"] > 0 and r["optimizer_step_s"] > 0 for r in res["rows"])
        assert 0 < res["auto"]["tiny"]["cost_s"] < 30
    text = (tmp_path / "muon_step.md").read_text()
    assert text.count("| tiny |") == 4 and "target at most x1.30" in text


def test_newton_schulz_flops_are_three_matmuls_per_iteration_in_the_wide_orientation():
    """A 64 x 256 matrix (or its transpose, which is run as 64 x 256): per iteration X X^T 2*64*64*256, the quintic's
    A A 2*64^3, the product with X 2*64*64*256; GPT-2 tiny's eight matrices at 5 iterations add up to 0.147 GFLOP."""
    import bench_muon_floor

    from hf_optbench.models import GPT2_SIZES
    from hf_optbench.optim.muon_precision import gpt2_matrix_shapes

    one = 2 * 64 * 64 * 256 + 2 * 64 ** 3 + 2 * 64 * 64 * 256
    assert bench_muon_floor.ns_flops([(64, 256)], ns_steps=1) == bench_muon_floor.ns_flops([(256, 64)], 1) == one
    tiny = gpt2_matrix_shapes(GPT2_SIZES["tiny"]["n_layer"], GPT2_SIZES["tiny"]["n_embd"])
    assert round(bench_muon_floor.ns_flops(tiny) / 1e9, 3) == 0.147


@pytest.mark.slow
def test_bench_muon_floor_measures_the_floor_and_muon_beside_adamw(tmp_path):
    """One round at tiny, natively: the GEMM rates, both steps, one Newton-Schulz pass per timed precision, and a
    floor below AdamW's step plus Newton-Schulz at the GEMM rate (the optimizer step alone taken out)."""
    import bench_muon_floor

    assert bench_muon_floor.main(["--sizes", "tiny", "--rounds", "1", "--steps", "2", "--warmup", "1", "--envs",
                                  "native", "--out", str(tmp_path)]) == 0
    (env,) = json.loads((tmp_path / "muon_floor.json").read_text())["results"]
    row = env["sizes"]["tiny"]
    assert env["gemm_gflops"]["fp32"] > 0 and row["adamw_step_s"] > row["adamw_optimizer_step_s"] > 0
    assert row["muon_step_s"] > 0 and row["ns_pass_ms"]["fp32"] > 0 and row["muon_ns_precision"] in ("fp32", "bf16")
    floor = bench_muon_floor.floor(env, "tiny")
    fp32 = floor["per_precision"]["fp32"]
    assert fp32["floor_ratio"] == pytest.approx(
        (row["adamw_step_s"] - row["adamw_optimizer_step_s"] + row["ns_gflop"] / env["gemm_gflops"]["fp32"])
        / row["adamw_step_s"])
    assert floor["lowest"] == min(v["floor_ratio"] for v in floor["per_precision"].values())
    assert "| native | tiny | 2x64x64,2x64x192,4x64x256 | 0.147 |" in (tmp_path / "muon_floor.md").read_text()


def test_the_per_matrix_path_is_swapped_in_for_the_block_only():
    """The benchmark's "before" rows step through muon_per_matrix; outside the block MuonNS is batched again."""
    import bench_muon_step

    from hf_optbench.optim import muon_impl

    batched = muon_impl.muon_batched
    with bench_muon_step.newton_schulz_path("per-matrix"):
        assert muon_impl.muon_batched is muon_impl.muon_per_matrix
    with bench_muon_step.newton_schulz_path("batched"):
        assert muon_impl.muon_batched is batched
    assert muon_impl.muon_batched is batched


@pytest.mark.slow
def test_bench_ns_precision_runs_the_cell_at_both_precisions(tmp_path):
    """On a few steps (0.02 tokens/param, one seed, a 3-rung ladder): both sweeps run, each Muon run states its
    precision, and the speedups are read off the seed's AdamW ladder."""
    import bench_ns_precision

    with pytest.warns(UserWarning, match="no tuned file"):
        assert bench_ns_precision.main(["--tuned", str(tmp_path / "none.yaml"), "--seeds", "1", "--tokens_per_param",
                                        "0.02", "--multiples", "0.5", "1", "2", "--work", str(tmp_path / "w"),
                                        "--out", str(tmp_path / "out")]) == 0
    res = json.loads((tmp_path / "out" / "ns_precision.json").read_text())
    (row,) = res["rows"]
    assert "Newton-Schulz bf16" in row["bf16"]["implementation"] and "Newton-Schulz fp32" in row["fp32"]["implementation"]
    assert row["bf16"]["speedup"] is not None and row["fp32"]["speedup"] is not None
    assert row["bf16"]["final_eval_loss"] != row["fp32"]["final_eval_loss"]  # the precision changed the run
    assert "cited values" in res["meta"]["tuned"]
    assert "| 1 |" in (tmp_path / "out" / "ns_precision.md").read_text()


@pytest.mark.slow
def test_bench_step_breakdown_assigns_the_step_to_parts_and_writes_its_files(tmp_path, capsys):
    """The CPU demo's run, both sides part by part (~20 s: the demo's sweep file is read and its data built)."""
    import bench_step_breakdown

    assert bench_step_breakdown.main(["--rounds", "1", "--steps", "12", "--skip", "3", "--malloc", "default",
                                      "--logging-steps", "3", "--out-dir", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "step_breakdown.json").read_text())
    ours, plain = res["hf_optbench"]["parts_ms"], res["plain"]["parts_ms"]
    for part in ("data", "forward", "backward", "optimizer step", "Trainer: logging",
                 "callback: OptBenchRecorder", "callback: ConsoleProgress", "callback: PlanStamp"):
        assert ours[part] > 0, part
    # the loop is the step less its timed parts: under load, with a handful of intervals, a part that straddles a
    # sync can make it negative; what must hold is that the parts and the loop make up the step (few intervals:
    # no trimming, so the means add up, to the rounding of each part to 0.001 ms)
    for side in (res["hf_optbench"], res["plain"]):
        assert abs(sum(side["parts_ms"].values()) - side["mean_step_ms"]) < 0.002 * len(side["parts_ms"]) + 0.01
    assert {"data", "forward", "backward", "optimizer step", "plain: loop"} <= set(plain)
    assert all(v > 0 for v in res["eval_per_run_s"].values()) and res["logging_steps"] == 3
    text = (tmp_path / "step_breakdown.md").read_text()
    assert "| callback: OptBenchRecorder |" in text and "ratio" in text


def test_bench_compile_break_even_and_reproducibility_from_constructed_runs():
    """The arithmetic of bench_compile.py on made-up runs (its measurement runs compile for minutes): eager 10 ms a
    step, compiled 8 ms with 5 s more per warm run and 30 s for the cold one."""
    import bench_compile

    def run(variant, tag, step, beyond, losses):
        return {"variant": variant, "tag": tag, "process_wall_s": 0.0, "startup_s": 0.0, "train_runtime_s": 1.0,
                "step_time_median_s": step, "beyond_steady_s": beyond, "steps": 3, "final_train_loss": losses[3],
                "final_eval_loss": 2.0, "losses": losses}

    eager, compiled = {1: 3.0, 2: 2.5, 3: 2.25}, {1: 3.0, 2: 2.5, 3: 2.2500001}
    runs = [run("eager", "a", 0.010, 2.0, eager), run("eager", "b", 0.010, 2.0, dict(eager)),
            run("compiled, cold cache", "cold", 0.008, 32.0, compiled),
            run("compiled, warm cache", "warm1", 0.008, 7.0, dict(compiled)),
            run("compiled, warm cache", "warm2", 0.008, 7.0, dict(compiled))]
    res = bench_compile._analyse(runs, [1000, 2000, 4000], 3)
    assert res["eager_identical_run_to_run"] and res["compiled_identical_run_to_run"]
    assert res["compile_cost_s"] == {"cold": 30.0, "warm1": 5.0, "warm2": 5.0}
    assert res["break_even_steps"] == pytest.approx(2500)  # 5 s / 2 ms
    assert res["net_over_demo_runs_s"] == pytest.approx(7000 * 0.002 - 2 * 5.0 - 30.0)
    assert res["runs"][2]["max_abs_loss_diff_vs_eager"] == pytest.approx(1e-7, abs=1e-9)
    text = bench_compile.render({**res, "date": "d", "machine": "m", "torch": "t", "load_average": 0.0}, "cmd")
    assert "break-even after 2500 steps" in text and "would cost 26 s" in text


@pytest.mark.slow
def test_bench_study_step_measures_every_row_and_sets_an_older_run_beside_it(tmp_path, monkeypatch):
    """Every row against AdamW's at its size, Muon as auto resolves it and with each precision forced, the AVX2
    environment with AdamW and Muon only; a --json run of another checkout is set beside this one's (here the same
    package twice: the table's shape, not a timing, so the native child's measurements serve both runs)."""
    import bench_study_step

    children: dict[str, dict] = {}
    measure_env = bench_study_step._run_env
    monkeypatch.setattr(bench_study_step, "_run_env",
                        lambda env, args, **kw: children.get(env) or children.setdefault(env, measure_env(env, args, **kw)))
    common = ["--sizes", "tiny", "--rounds", "1", "--steps", "2", "--warmup", "1", "--optimizers", "adamw", "muon",
              "soap"]
    assert bench_study_step.main([*common, "--envs", "native", "--json", str(tmp_path / "before.json")]) == 0
    assert bench_study_step.main([*common, "--envs", "native", "avx2", "--before", str(tmp_path / "before.json"),
                                  "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "study_step.json").read_text())
    rows = {(res["env"], r["row"]) for res in doc["results"] for r in res["rows"]}
    assert rows == {("native", "adamw"), ("native", "muon"), ("native", "muon bf16"), ("native", "muon fp32"),
                    ("native", "soap"), ("avx2", "adamw"), ("avx2", "muon"), ("avx2", "muon fp32")}
    assert all(r["step_time_median_s"] > 0 and r["optimizer_step_median_s"] > 0
               for res in doc["results"] for r in res["rows"])
    table = (tmp_path / "study_step.md").read_text()
    assert "| native | tiny | soap (study) | " in table and "| avx2 | tiny | muon fp32 (study) | " in table
    assert "The CPU study's optimizers within 1.5x AdamW's training step at tiny: adamw x1.00" in table
    assert doc["results"][0]["machine"]["lscpu"].keys() == {"model_name", "avx512", "avx2"}
    assert table.count("| native | tiny |") == 5 and "| avx2 | tiny | adamw (study) | – | – | – | – |" in table


def test_bench_study_step_takes_every_registry_optimizer_this_machine_runs():
    """By default every registry entry, AdamW first; one needing CUDA skipped on a CPU with its reason, kept on a GPU."""
    import bench_study_step

    from hf_optbench.optim.registry import OPTIMIZERS

    cpu, skipped = bench_study_step.registry_optimizers(cuda=False)
    assert cpu[0] == "adamw" and set(cpu) | set(skipped) == set(OPTIMIZERS) and not set(cpu) & set(skipped)
    assert set(skipped) == {n for n, spec in OPTIMIZERS.items() if spec.requires_cuda} == {"paged_adamw_8bit",
                                                                                          "paged_lion_8bit"}
    assert set(bench_study_step.STUDY) <= set(cpu)
    gpu, none = bench_study_step.registry_optimizers(cuda=True)
    assert set(gpu) == set(OPTIMIZERS) and none == {}


def test_bench_study_step_times_sophias_step_alone_past_its_hessian_period():
    """Sophia-G refuses a tenth step without a Hessian estimate: its optimizer step alone runs the estimate untimed
    between steps, on the backward's gradients each time."""
    import bench_study_step

    from hf_optbench.study.calibration import Entry, torch_threads

    with torch_threads(1):
        row = bench_study_step._optimizer_step(Entry("sophia", "tiny", bench_study_step._args("sophia", "tiny", None)),
                                               steps=12, warmup=1)
    assert row["optimizer_step_median_s"] > 0 and row["ns_precision"] is None


def test_bench_study_step_interleaves_the_older_checkout_round_by_round(monkeypatch):
    """--before-pythonpath: one child per round, package and environment, the packages alternating, each child's
    rows rotated by its round; the children's rounds merged side by side (a stub child: the order, not a timing)."""
    import argparse

    import bench_study_step

    calls = []

    def fake(env, args, *, rounds=None, offset=0, pythonpath=None):
        calls.append((env, offset, pythonpath))
        ms = 2.0 if pythonpath else 1.0
        rows = [{"row": name, "model_size": "tiny", "optimizer": name, "ns_precision": None,
                 "step_time_round_medians_s": [ms * k + offset], "step_time_median_s": ms * k + offset,
                 "optimizer_step_median_s": 0.1 * (offset + 1), "optimizer_step_mean_s": 0.2}
                for k, name in ((1, "adamw"), (10, "soap"))]
        return {"env": env, "machine": {}, "rows": rows[offset % 2:] + rows[:offset % 2]}  # rotated, as a child

    monkeypatch.setattr(bench_study_step, "_run_env", fake)
    args = argparse.Namespace(rounds=3, envs=["native", "avx2"], before_pythonpath="/old")
    after, before = bench_study_step.interleaved(args)
    assert calls == [("native", 0, None), ("native", 0, "/old"), ("avx2", 0, None), ("avx2", 0, "/old"),
                     ("native", 1, "/old"), ("native", 1, None), ("avx2", 1, "/old"), ("avx2", 1, None),
                     ("native", 2, None), ("native", 2, "/old"), ("avx2", 2, None), ("avx2", 2, "/old")]
    rows = {r["row"]: r for r in after[0]["rows"]}
    assert rows["adamw"]["step_time_round_medians_s"] == [1.0, 2.0, 3.0] and rows["adamw"]["step_time_median_s"] == 2.0
    assert rows["soap"]["step_time_round_medians_s"] == [10.0, 11.0, 12.0]  # matched by name, not by position
    assert rows["adamw"]["optimizer_step_round_s"] == pytest.approx([0.1, 0.2, 0.3])
    assert {r["row"]: r["spread"] for r in before[0]["rows"]} == {"adamw": [2, 4], "soap": [20, 22]}
