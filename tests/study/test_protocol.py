"""The study protocol: tune, then compare (one sweep file), no silent fallback to a cited rate, secrets never on
disk, and every run grouped for W&B.

The runs are a stand-in for ``hf_optbench.run`` (``launcher.type: command``) that takes the same arguments, reads
the tuned-values file as hf_optbench.run does, and writes a summary.json whose ``final_tuning_loss`` is lowest at a known
learning rate per optimizer and size, so the selection has a known answer. Validation is on: every run's arguments
go through hf_optbench.config.parse.parse_args, as in a real sweep.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from pathlib import Path

import pytest
import yaml

from hf_optbench.cli import main as hf_optbench_main
from hf_optbench.config.parse import parse_args
from hf_optbench.errors import OptBenchError
from hf_optbench.optim.registry import optimizer_defaults
from hf_optbench.run.plan import resolve_hyperparameters
from hf_optbench.rundir import read_state
from hf_optbench.study.sweep import run_sweep
from hf_optbench.study.sweep_spec import load_sweep

REPO = Path(__file__).resolve().parents[2]
FAKE_RUN = r'''
import argparse, hashlib, json, math, os, pathlib, sys
p = argparse.ArgumentParser()
p.add_argument("recipe")
for k in ("--output_dir", "--optimizer", "--model_size", "--run_name", "--tuned_hparams_file"):
    p.add_argument(k)
p.add_argument("--seed", type=int)
p.add_argument("--learning_rate", type=float)
p.add_argument("--tuning_blocks", type=int, default=0)
a, _ = p.parse_known_args()
out = pathlib.Path(a.output_dir)
out.mkdir(parents=True, exist_ok=True)
secret = os.environ.get("HF_TOKEN", "")
seen = {"argv": sys.argv[1:], "wandb": {k: v for k, v in os.environ.items() if k.startswith("WANDB_")},
        "hf_token_sha256": hashlib.sha256(secret.encode()).hexdigest() if secret else None}
(out / "seen.json").write_text(json.dumps(seen))
if os.environ.get("FAKE_WANDB"):
    import wandb
    run = wandb.init(mode="offline", dir=str(out), project="optbench-test")
    got = {"group": run.group, "tags": list(run.tags), "name": run.name, "job_type": run.job_type,
           "point": json.loads(os.environ["HF_OPTBENCH_SWEEP_POINT"])}
    (out / "wandb_run.json").write_text(json.dumps(got))
    run.finish()
lr, source = a.learning_rate, "user"
if lr is None and a.tuned_hparams_file:  # as run.plan.resolve_hyperparameters does
    import yaml
    lr = yaml.safe_load(open(a.tuned_hparams_file))[a.optimizer][a.model_size]["learning_rate"]
    source = "tuned: " + a.tuned_hparams_file
crash = json.loads(os.environ.get("FAKE_CRASH_ONCE", "{}"))
if a.run_name in crash.get("ids", []) and not (pathlib.Path(crash["dir"]) / a.run_name).exists():
    (pathlib.Path(crash["dir"]) / a.run_name).write_text("crashed")  # outside the run dir, which is moved aside
    print("Traceback (most recent call last):\nRuntimeError: worker killed", file=sys.stderr)
    sys.exit(1)
key = a.optimizer + "/" + a.model_size
diverged = key in json.loads(os.environ.get("FAKE_DIVERGE", "[]"))
best = json.loads(os.environ.get("FAKE_BEST_LR", "{}")).get(key)
tuning = None if diverged or not a.tuning_blocks or lr is None or best is None else \
    3.0 + math.log2(lr / best) ** 2 + 0.001 * a.seed
summary = {"status": "diverged" if diverged else "completed", "optimizer": a.optimizer, "model_size": a.model_size,
           "seed": a.seed, "num_params": 1000, "steps": 4, "learning_rate": lr, "final_eval_loss": 4.0,
           "final_tuning_loss": tuning, "hyperparameter_sources": {"learning_rate": source}, "error": None}
(out / "summary.json").write_text(json.dumps(summary))
'''
# The multiplier of each optimizer's cited default whose runs the stand-in makes best (a known answer).
BEST_MULT = {"adamw": 2.0, "lion": 0.5}
SECRET = "hf_" + "Zq8" * 12  # shaped like a Hub token
OTHER_SECRET = "sk-not-a-hub-token-but-secret-42"


def _write(tmp_path: Path, *, tune: dict | None = None, overrides: dict | None = None, sizes=("tiny", "mini"),
           seeds=(1, 2), env: dict | None = None, launcher: dict | None = None, name: str = "sweep.yaml") -> Path:
    fake = tmp_path / "fake_run.py"
    fake.write_text(FAKE_RUN)
    best = {f"{o}/{s}": optimizer_defaults(o, s)["learning_rate"] * m for o, m in BEST_MULT.items() for s in sizes}
    sweep = {
        "name": "proto",
        "base": str(REPO / "recipes/quickstart_cpu.yaml"),
        "output_dir": str(tmp_path / "out"),
        "overrides": {"max_steps": 4, "tuning_blocks": 4, **(overrides or {})},
        "matrix": {"optimizer": list(BEST_MULT), "model_size": list(sizes), "seed": list(seeds)},
        "launcher": {"type": "command", "command": ["{python}", str(fake)],
                     "env": {"FAKE_BEST_LR": json.dumps(best), **(env or {})}, **(launcher or {})},
    }
    if tune is not None:  # the learning-rate protocol alone: confirmation and group rates have their own tests
        sweep["tune"] = {"confirm_seeds": [], "nonmatrix_multipliers": [], **tune}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(sweep))
    return path


def _seen(out: Path, phase: str = "") -> dict[str, dict]:
    runs = out / phase / "runs" if phase else out / "runs"
    return {p.parent.name: json.loads(p.read_text()) for p in runs.glob("*/seen.json")}


def test_a_tuning_point_lost_to_a_crash_is_run_once_more_before_it_counts(tmp_path: Path) -> None:
    """The best grid point crashes on its first attempt (a killed worker): it is run again, so the tuned rate is
    still the best one, not silently its neighbour."""
    (tmp_path / "crashed").mkdir()
    crash = {"dir": str(tmp_path / "crashed"), "ids": ["adamw__tiny__s0__lrx2"]}
    path = _write(tmp_path, tune={"lr_multipliers": [0.5, 1, 2, 4], "seed": [0]}, sizes=("tiny",), seeds=(1,),
                  env={"FAKE_CRASH_ONCE": json.dumps(crash)})
    log = io.StringIO()
    run_sweep(path, stream=log)
    out = tmp_path / "out"
    assert "retrying the run(s) that failed on their first attempt, once" in log.getvalue()
    starts = [r for r in read_state(out / "tuning" / "sweep_state.jsonl")
              if r["event"] == "start" and r["run_id"] == "adamw__tiny__s0__lrx2"]
    assert len(starts) == 2
    assert yaml.safe_load((out / "tuned_hparams.yaml").read_text())["adamw"]["tiny"]["multiplier"] == 2.0


def test_tune_then_compare(tmp_path: Path) -> None:
    """The grid runs first (cited default x 0.5/1/2, the comparison's horizon, a tuning split), the best mean
    final_tuning_loss per optimizer x size goes to tuned_hparams.yaml with its provenance, then the comparison
    seeds run at those rates and say so."""
    path = _write(tmp_path, tune={"lr_multipliers": [0.5, 1, 2], "seed": [0]})
    log = io.StringIO()
    # adamw's best (x2) and lion's (x0.5) sit at the grid's edges: one factor-2 step beyond each (the loss rises
    # there, so both are bracketed), then lion's weight decay x1/3 and x3 at its tuned rate
    assert run_sweep(path, stream=log) == {"completed": 12 + 4 + 4 + 8}
    out = tmp_path / "out"
    tuned = yaml.safe_load((out / "tuned_hparams.yaml").read_text())
    for opt, mult in BEST_MULT.items():
        for size in ("tiny", "mini"):
            entry = tuned[opt][size]
            assert entry["multiplier"] == mult
            assert entry["learning_rate"] == pytest.approx(optimizer_defaults(opt, size)["learning_rate"] * mult,
                                                           rel=1e-5)
            grid = [0.5, 1.0, 2.0, 4.0] if opt == "adamw" else [0.25, 0.5, 1.0, 2.0]
            assert entry["metric"] == "final_tuning_loss" and entry["grid"] == grid and entry["bracketed"]
            assert entry["seeds"] == [0] and entry["tuning_dir"] == "tuning"  # beside the tuned file, never an absolute path
            assert [c["multiplier"] for c in entry["curve"]] == grid
            assert "tuned by tuning on" in entry["source"] and str(out) not in entry["source"] and "final_tuning_loss" in entry["source"]
    tuning_runs = _seen(out, "tuning")
    assert len(tuning_runs) == 20 and all("__s0__lrx" in rid for rid in tuning_runs)
    for seen in tuning_runs.values():  # same horizon as the comparison, own split, the grid's rate
        argv = " ".join(seen["argv"])
        assert "--max_steps=4" in argv and "--tuning_blocks=4" in argv and "--learning_rate" in argv
        assert "--tuned_hparams_file" not in argv
    compared = _seen(out)
    assert sorted(compared) == sorted(f"{o}__{s}__s{seed}" for o in BEST_MULT for s in ("tiny", "mini")
                                      for seed in (1, 2))
    for rid, seen in compared.items():
        argv = seen["argv"]
        assert argv[argv.index("--tuned_hparams_file") + 1] == str(out / "tuned_hparams.yaml")
        assert "--learning_rate" not in argv
        summary = json.loads((out / "runs" / rid / "summary.json").read_text())
        opt, size = rid.split("__")[:2]
        assert summary["learning_rate"] == tuned[opt][size]["learning_rate"]
    # the tuning phase ended before the comparison's first run started
    last_tuning_end = max(r["time"] for r in read_state(out / "tuning" / "sweep_state.jsonl") if r["event"] == "end")
    first_compare = min(r["time"] for r in read_state(out / "sweep_state.jsonl") if r["event"] == "start")
    assert last_tuning_end <= first_compare
    assert "tuned learning rates ->" in log.getvalue()
    # a compared run's config, as run.py resolves it: the learning rate is the tuned one, and says so
    cfg = parse_args(argv + ["--output_dir", str(tmp_path / "never"), "--use_cpu", "true"])
    chosen = resolve_hyperparameters(cfg)
    assert chosen["learning_rate"]["source"] == "tuned: tuned_hparams.yaml"
    assert chosen["learning_rate"]["value"] == tuned[opt][size]["learning_rate"]
    assert chosen["weight_decay"]["source"] not in ("user", "transformers default")  # the registry's citation
    # restart: nothing runs again, the tuned file is rewritten with the same values
    assert run_sweep(path, stream=io.StringIO()) == {"completed": 28}
    assert sum(1 for r in read_state(out / "sweep_state.jsonl") if r["event"] == "start") == 8
    assert yaml.safe_load((out / "tuned_hparams.yaml").read_text()) == tuned


def test_a_size_the_tuning_could_not_tune_stops_before_the_comparison(tmp_path: Path) -> None:
    """Every grid point of lion/mini diverges: exit 2 naming it, and no comparison run starts."""
    path = _write(tmp_path, tune={"lr_multipliers": [0.5, 1, 2]}, env={"FAKE_DIVERGE": json.dumps(["lion/mini"])})
    with pytest.raises(OptBenchError, match="no usable learning rate for lion/mini"):
        run_sweep(path, stream=io.StringIO())
    out = tmp_path / "out"
    assert not list((out / "runs").iterdir()) and not (out / "tuned_hparams.yaml").exists()
    assert hf_optbench_main(["sweep", str(path)]) == 2  # the CLI: one line, exit 2


def test_a_tuned_file_without_a_compared_size_is_an_error_before_any_run(tmp_path: Path) -> None:
    """Tuning by hand (tune_cpu.yaml + `hf-optbench tune`): a compared size missing from the file is refused
    before anything runs, never run at its cited rate."""
    tuned = tmp_path / "tuned.yaml"
    tuned.write_text(yaml.safe_dump({"adamw": {"tiny": {"learning_rate": 1e-3}, "mini": {"learning_rate": 1e-3}},
                                     "lion": {"tiny": {"learning_rate": 1e-4}}}))
    path = _write(tmp_path, overrides={"tuned_hparams_file": str(tuned)})
    with pytest.raises(OptBenchError, match="lion__mini__s1.*no learning rate for lion/mini.*never falls back"):
        run_sweep(path, stream=io.StringIO())
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("tune, overrides, match", [
    ({"lr_multipliers": [1, 2]}, {}, "at least 3"),
    ({"lr_multipliers": [2, 4, 8]}, {}, "1 \\(the cited default\\) among them"),
    ({"seed": [0]}, {}, "tune needs lr_multipliers"),
    ({"lr_multipliers": [0.5, 1, 2], "seeds": [0]}, {}, "unknown key 'seeds' in tune.*seed"),
    ({"lr_multipliers": [0.5, 1, 2]}, {"learning_rate": 1e-3}, "'learning_rate' in overrides would replace"),
    ({"lr_multipliers": [0.5, 1, 2]}, {"tuned_hparams_file": "x.yaml"}, "'tuned_hparams_file' in overrides"),
    ({"lr_multipliers": [0.5, 1, 2]}, {"tuning_blocks": 0}, "tuning_blocks"),
])
def test_bad_tune_sections_fail_before_launch(tmp_path: Path, tune: dict, overrides: dict, match: str) -> None:
    path = _write(tmp_path, tune=tune, overrides=overrides)
    with pytest.raises(OptBenchError, match=match):
        run_sweep(path, stream=io.StringIO())
    assert not (tmp_path / "out").exists()


def test_old_sweep_files_still_load() -> None:
    """Every shipped sweep file loads; the demo tunes every size it compares and compares >= 3 seeds."""
    for path in sorted((REPO / "recipes" / "sweeps").glob("*.yaml")):
        load_sweep(path)
    demo = load_sweep(REPO / "recipes" / "sweeps" / "cpu_demo.yaml")
    assert demo.tune is not None and demo.tuning is not None and len(demo.tune.multipliers) >= 3
    assert {(r.optimizer, r.model_size) for r in demo.tuning.runs} == {(r.optimizer, r.model_size) for r in demo.runs}
    assert len({r.seed for r in demo.runs}) >= 3 and not {r.seed for r in demo.runs} & set(demo.tune.seeds)
    assert not {r.seed for r in demo.runs} & set(demo.tune.confirm_seeds)  # a tuning run is never a compared one
    assert demo.overrides.get("tuning_blocks", 0) > 0 and demo.overrides.get("save_strategy") == "no"


def _all_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_secret_values_are_never_written_or_printed(tmp_path: Path, executor: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A token in launcher.env reaches the run, but no file of the sweep directory holds it (manifest, sweep.yaml
    copy, state, logs, submitit's pickles) and nothing printed shows it; the names stay."""
    launcher = {"executor": "slurm", "slurm": {"cluster": "local", "timeout_min": 5}} if executor == "slurm" else {}
    if executor == "slurm":
        pytest.importorskip("submitit")
    path = _write(tmp_path, sizes=("tiny",), seeds=(1,), launcher=launcher,
                  env={"HF_TOKEN": SECRET, "my_api_key": OTHER_SECRET, "PLAIN_SETTING": "visible-value"})
    log = io.StringIO()
    assert run_sweep(path, stream=log) == {"completed": 2}
    assert run_sweep(path, dry_run=True, stream=log) == {"completed": 2}
    out = tmp_path / "out"
    blob = _all_bytes(out)
    for value in (SECRET, OTHER_SECRET):
        assert value.encode() not in blob
        assert value not in log.getvalue() + "".join(capsys.readouterr())
    assert b"visible-value" in blob  # only secret-named values are withheld
    manifest = json.loads((out / "sweep_manifest.json").read_text())
    assert manifest["launcher"]["env"]["HF_TOKEN"] == "<redacted>"
    assert manifest["launcher"]["env"]["my_api_key"] == "<redacted>"
    assert "HF_TOKEN" in (out / "sweep.yaml").read_text()
    seen = _seen(out)["adamw__tiny__s1"]
    assert seen["hf_token_sha256"] == hashlib.sha256(SECRET.encode()).hexdigest()  # the run still got it


CMD_SECRET = "cmd-secret-value-7f3a"  # not token-shaped: only the NAME=value rule withholds it


@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_secret_values_in_the_launcher_command_are_never_written_or_printed(
        tmp_path: Path, executor: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``command: [env, MY_SECRET=..., HF_TOKEN=..., python, ...]``: the run still gets the values, but the copy of
    the sweep file, the manifest, the state rows, each run's stdout.log, submitit's pickles and the dry run show
    only the names."""
    launcher = {"executor": "slurm", "slurm": {"cluster": "local", "timeout_min": 5}} if executor == "slurm" else {}
    if executor == "slurm":
        pytest.importorskip("submitit")
    path = _write(tmp_path, sizes=("tiny",), seeds=(1,), launcher={**launcher, "command": [
        "env", f"MY_SECRET={CMD_SECRET}", f"HF_TOKEN={SECRET}", "PLAIN_SETTING=visible-value", "{python}",
        str(tmp_path / "fake_run.py")]})
    log = io.StringIO()
    assert run_sweep(path, stream=log) == {"completed": 2}
    assert run_sweep(path, dry_run=True, stream=log) == {"completed": 2}
    out = tmp_path / "out"
    blob = _all_bytes(out)
    for value in (CMD_SECRET, SECRET):
        assert value.encode() not in blob
        assert value not in log.getvalue() + "".join(capsys.readouterr())
    assert b"visible-value" in blob and b"MY_SECRET=<redacted>" in blob  # the names stay, other values too
    manifest = json.loads((out / "sweep_manifest.json").read_text())
    assert "MY_SECRET=<redacted>" in manifest["launcher"]["command"]
    assert "MY_SECRET" in (out / "sweep.yaml").read_text()
    if executor == "local":  # a SLURM job's command leaves the secret assignments out (exported instead)
        assert "MY_SECRET=<redacted>" in (out / "runs" / "adamw__tiny__s1" / "stdout.log").read_text()
    seen = _seen(out)["adamw__tiny__s1"]
    assert seen["hf_token_sha256"] == hashlib.sha256(SECRET.encode()).hexdigest()  # the run still got it


@pytest.mark.slow
def test_secret_values_stay_out_of_a_real_python_sweep(tmp_path: Path) -> None:
    """The demo's path (launcher type python, the warm worker when it is available): a real 2-step tiny run, and
    no file of the sweep directory (worker log, run logs, config.yaml, summary.json) holds the token."""
    sweep = {"base": str(REPO / "recipes/quickstart_cpu.yaml"), "output_dir": str(tmp_path / "out"),
             "overrides": {"max_steps": 2, "eval_steps": 2, "block_size": 32, "save_strategy": "no"},
             "matrix": {"optimizer": ["adamw"], "model_size": ["tiny"], "seed": [0]},
             "launcher": {"type": "python", "env": {"HF_TOKEN": SECRET, "WANDB_API_KEY": OTHER_SECRET}}, "calibration": False}
    path = tmp_path / "real.yaml"
    path.write_text(yaml.safe_dump(sweep))
    log = io.StringIO()
    assert run_sweep(path, stream=log) == {"completed": 1}
    blob = _all_bytes(tmp_path / "out")
    assert SECRET.encode() not in blob and OTHER_SECRET.encode() not in blob
    assert SECRET not in log.getvalue() and OTHER_SECRET not in log.getvalue()


@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_runs_are_grouped_for_wandb(tmp_path: Path, executor: str) -> None:
    """Offline W&B in a run launched by the sweep: the sweep is the group, the matrix point the tags, the run id
    the name (read from the wandb.Run object in the run, not from files wandb writes), and the run's environment
    holds the matrix point for its tracker config."""
    pytest.importorskip("wandb")
    launcher = {"executor": "slurm", "slurm": {"cluster": "local", "timeout_min": 5}} if executor == "slurm" else {}
    if executor == "slurm":
        pytest.importorskip("submitit")
    path = _write(tmp_path, sizes=("tiny",), seeds=(1,), launcher=launcher,
                  env={"FAKE_WANDB": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    data = yaml.safe_load(path.read_text())
    data["matrix"]["optimizer"] = ["lion"]
    path.write_text(yaml.safe_dump(data))
    assert run_sweep(path, stream=io.StringIO()) == {"completed": 1}
    got = json.loads((tmp_path / "out" / "runs" / "lion__tiny__s1" / "wandb_run.json").read_text())
    assert got["group"] == "proto" and got["name"] == "lion__tiny__s1" and got["job_type"] == "compare"
    assert set(got["tags"]) == {"optimizer:lion", "model_size:tiny", "seed:1", "phase:compare"}
    assert got["point"] == {"sweep": "proto", "phase": "compare", "run_id": "lion__tiny__s1", "optimizer": "lion",
                            "model_size": "tiny", "seed": 1, "lr_multiplier": None}


def test_tuning_runs_carry_their_multiplier_for_wandb(tmp_path: Path) -> None:
    spec = load_sweep(_write(tmp_path, tune={"lr_multipliers": [0.5, 1, 2]}))
    run = next(r for r in spec.tuning.runs if r.lr_multiplier == 0.5)
    assert run.env["WANDB_RUN_GROUP"] == "proto-tuning" and "lr_multiplier:0.5" in run.env["WANDB_TAGS"].split(",")
    assert run.env["WANDB_JOB_TYPE"] == "tune" and run.env["WANDB_NAME"] == run.run_id
    assert math.isclose(run.lr_multiplier, 0.5)
