"""What a run refuses before torch is imported (issue 39): bf16 on a machine without a GPU (a refusal through `run`
took 16-35 s on a loaded machine where `validate` answered in 0.7 s: torch was imported to find no GPU), also under
`accelerate launch`, and a recipe recorded by a 2-process run rerun on 1 process; and what parse_args refuses with
no model (a value of the wrong type, a negative or non-finite rate, an init_from that holds no model, an output_dir
holding another tool's checkpoint), refused by ``run`` and ``validate --full`` alike in parse_args' own words."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hf_optbench.machine import gpu_visible

ROOT = Path(__file__).resolve().parents[2]
LARGE = str(ROOT / "recipes" / "lion_gpt2_large.yaml")
NO_GPU = pytest.mark.skipif(gpu_visible(), reason="a GPU is visible here: the bf16 check needs torch")
# The run's own entry point in a fresh interpreter; prints (rc, whether torch was imported) after its stderr.
RUN = ("import sys; from hf_optbench.run.train import main; rc = main(sys.argv[1:]);"
       "print(rc, 'torch' in sys.modules)")


def _run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUN, *argv], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=env)


@NO_GPU
def test_the_headline_recipe_is_refused_without_importing_torch(tmp_path: Path) -> None:
    proc = _run(LARGE, "--output_dir", str(tmp_path / "out"))
    assert proc.stdout.split() == ["2", "False"], proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and "bf16 true" in line and "no GPU" in line and "--bf16 false" in line
    assert "--use_cpu true" in line  # the other override that runs it here (bf16 as the CPU's autocast)


def test_a_two_process_recipe_on_one_process_is_refused_naming_both(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    line = "accelerate launch --config_file accelerate_configs/cpu_ddp2.yaml -m hf_optbench.run runs/x/config.yaml"
    config.write_text(f"# Resolved configuration of this run. Rerun it with\n#   {line} --output_dir NEW_DIR\n"
                      "model_size: tiny\nnum_processes: 2\n")
    proc = _run(str(config), "--output_dir", str(tmp_path / "out"))
    assert proc.stdout.split() == ["2", "False"], proc.stdout
    (err,) = proc.stderr.strip().splitlines()
    assert "num_processes 2" in err and "this run has 1" in err and line in err and "--num_processes 1" in err
    assert not (tmp_path / "out").exists()


def test_parse_checks_the_number_of_processes_too(tmp_path: Path) -> None:
    """validate --full and every caller of parse_args, not only a run's preflight."""
    from hf_optbench.config.parse import parse_args
    from hf_optbench.errors import OptBenchError

    recipe = ROOT / "recipes" / "quickstart_cpu.yaml"
    with pytest.raises(OptBenchError, match="sets num_processes 4 .* this run has 1"):
        parse_args([str(recipe), "--output_dir", str(tmp_path / "o"), "--num_processes", "4"])
    assert parse_args([str(recipe), "--output_dir", str(tmp_path / "o"), "--num_processes", "1"]).run.num_processes == 1


@NO_GPU
@pytest.mark.slow
def test_the_headline_command_through_accelerate_launch_says_one_line_of_its_own(tmp_path: Path) -> None:
    """`accelerate launch -m hf_optbench.run recipes/lion_gpt2_large.yaml` on a CPU: our process writes exactly
    one line and exits 2 before torch. accelerate itself prints its defaults warning (no config file) and, for any
    non-zero exit of its script, a CalledProcessError traceback unless given --quiet: those lines are the
    launcher's, which the launched script cannot change."""
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    if accelerate is None:
        pytest.skip("accelerate's command is not installed")
    proc = subprocess.run([accelerate, "launch", "--quiet", "-m", "hf_optbench.run", LARGE, "--output_dir",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    ours = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode != 0 and len(ours) == 1 and "bf16 true" in ours[0], proc.stderr
    assert "--use_cpu true" in ours[0], ours[0]
    assert "Traceback" not in proc.stderr, proc.stderr


# -- what parse_args refuses with no model, refused by the pre-flight in its words, before torch is imported --------
QUICK = str(ROOT / "recipes" / "quickstart_cpu.yaml")
# (id, argv ({T}: the test's directory), words the one line names: the problem, then the fix)
REFUSED = [
    ("weight-decay-minus-inf", ["--weight_decay", "-inf"],
     ["weight_decay must be a finite number, got -inf", "Set a finite --weight_decay"]),
    ("weight-decay-negative", ["--weight_decay", "-0.1"],
     ["weight_decay must be >= 0, got -0.1", "Set --weight_decay to 0 or more"]),
    ("learning-rate-nan", ["--learning_rate", "nan"], ["learning_rate must be a finite number, got nan",
                                                       "Set a finite --learning_rate"]),
    ("max-steps-ten", ["--max_steps", "ten"], ["--max_steps/--max-steps: invalid int value: 'ten'",
                                               "Fix that value in the recipe or on the command line"]),
    ("max-steps-ten-in-recipe", ["{T}/steps_ten.yaml"], ["max_steps in recipe '{T}/steps_ten.yaml': invalid int "
                                                         "value: 'ten'", "Fix that value"]),
    ("synthetic-num-tokens-1e13", ["--data_source", "synthetic", "--synthetic_num_tokens", "1e13"],
     ["--synthetic_num_tokens/--synthetic-num-tokens: invalid int value: '1e13'", "Fix that value"]),
    ("tuning-blocks-1e12", ["--tuning_blocks", "1e12"], ["--tuning_blocks/--tuning-blocks: invalid int value: "
                                                         "'1e12'", "Fix that value"]),
    ("tuning-blocks-negative", ["--tuning_blocks", "-1"], ["tuning_blocks must be an integer >= 0, got -1",
                                                           "Use 0 for no tuning split"]),
    ("init-from-missing", ["--init_from", "{T}/no_such_model"], ["init_from '{T}/no_such_model' is not a directory",
                                                                 "Pass a directory holding config.json"]),
    ("init-from-no-model", ["--init_from", "{T}/empty"], ["init_from '{T}/empty' holds no model",
                                                          "Pass a directory holding config.json"]),
    ("output-dir-foreign-checkpoint", ["--output_dir", "{T}/foreign"],
     ["output_dir '{T}/foreign' holds files no hf_optbench run wrote (checkpoint-5/)",
      "Move them out of it, or choose a new --output_dir"]),
]


def _workspace(tmp_path: Path) -> None:
    """The files the cases of :data:`REFUSED` name: a recipe with a word for max_steps, an empty directory, and
    an output_dir holding another tool's Trainer checkpoint (its trainer_state.json without hf_optbench's stamp)."""
    recipe = Path(QUICK).read_text()
    assert "\nmax_steps: 50\n" in recipe
    (tmp_path / "steps_ten.yaml").write_text(recipe.replace("\nmax_steps: 50\n", "\nmax_steps: ten\n"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "foreign" / "checkpoint-5").mkdir(parents=True)
    (tmp_path / "foreign" / "checkpoint-5" / "trainer_state.json").write_text('{"global_step": 5}')


def _argv(case: list[str], tmp_path: Path) -> list[str]:
    """The case's tokens after the quickstart recipe (or its own recipe), with an output_dir of its own unless the
    case names one."""
    args = [a.replace("{T}", str(tmp_path)) for a in case]
    recipe = [] if args[0].endswith(".yaml") else [QUICK]
    out = [] if "--output_dir" in args else ["--output_dir", str(tmp_path / "out")]
    return [*recipe, *args, *out]


def _refused_without_torch(args: list[str], monkeypatch, capsys) -> list[str]:
    """The error lines of ``run`` and ``validate --full`` on ``args``, each asserted to exit 2, with torch and
    transformers unimportable (a check that reached for either would fail with an ImportError)."""
    from hf_optbench.cli import main as cli_main
    from hf_optbench.run.train import main as run_main

    with monkeypatch.context() as blocked:
        for name in ("torch", "transformers"):
            blocked.setitem(sys.modules, name, None)
        lines = []
        for call in (lambda: run_main(args), lambda: cli_main(["validate", *args, "--full"])):
            assert call() == 2
            lines.append(capsys.readouterr().err.strip())
    return lines


@pytest.mark.parametrize(("argv", "words"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_run_and_validate_full_refuse_before_torch_in_parse_args_words(argv: list[str], words: list[str],
                                                                      tmp_path: Path, monkeypatch, capsys) -> None:
    """``run`` and ``validate --full`` give the same one line, exit 2, with torch and transformers unimportable
    (a check that reached for either would fail here with an ImportError), and it is the line parse_args itself
    gives for the same arguments (the check it keeps for the Python API and a sweep's validation)."""
    from hf_optbench.config.parse import parse_args, training_annotations
    from hf_optbench.errors import OptBenchError

    _workspace(tmp_path)
    args = _argv(argv, tmp_path)
    training_annotations()  # transformers' source is found by its spec, which the block below hides (read once)
    run_line, validate_line = _refused_without_torch(args, monkeypatch, capsys)
    assert run_line == validate_line and len(run_line.splitlines()) == 1 and run_line.startswith("error: ")
    for word in words:
        assert word.replace("{T}", str(tmp_path)) in run_line, run_line
    with pytest.raises(OptBenchError) as late:
        parse_args(args)
    assert run_line == f"error: {late.value}"
    assert not (tmp_path / "out").exists()


def test_no_refusal_of_these_imports_torch(tmp_path: Path) -> None:
    """Every case of :data:`REFUSED` through the installed command's entry point, ``run`` and ``validate --full``,
    in one fresh interpreter: exit 2 each time, and torch is still not imported after the last."""
    _workspace(tmp_path)
    cases = [_argv(c[1], tmp_path) for c in REFUSED]
    script = ("import json, sys\nfrom hf_optbench.cli import main\nrcs = []\n"
              "for args in json.loads(sys.argv[1]):\n"
              "    rcs += [main(['run', *args]), main(['validate', *args, '--full'])]\n"
              "    rcs.append('torch' in sys.modules)\n"
              "print(json.dumps(rcs))\n")
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(cases)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [2, 2, False] * len(cases), proc.stderr[-3000:]


@pytest.mark.parametrize(("source", "key"), [("synthetic", "synthetic_num_tokens"), ("thai_sample", "max_train_tokens")])
def test_an_entry_too_large_for_the_disk_is_refused_before_torch(source: str, key: str, tmp_path: Path, monkeypatch,
                                                                 capsys) -> None:
    """``--synthetic_num_tokens 10000000000000`` (an integer: the type check passes), or a text source's
    ``--max_train_tokens`` as large, is refused by ``run`` and ``validate --full`` alike, with torch and
    transformers unimportable, in the words the data pipeline itself uses when it is about to build the entry (both
    call one room check). A text entry that large cannot be cached already, so the tokenizer that keys the cache's
    lookup is not needed to say so."""
    from hf_optbench.config.parse import parse_args, training_annotations
    from hf_optbench.data.pipeline import prepare_data
    from hf_optbench.errors import OptBenchError

    settings = {"data_source": source, key: 10**13, "data_cache_dir": str(tmp_path / "cache")}
    args = [QUICK, *(f"--{k}={v}" for k, v in settings.items()), "--output_dir", str(tmp_path / "out")]
    training_annotations()  # transformers' source is found by its spec, which the block below hides (read once)
    (tmp_path / "cache").mkdir()  # the pipeline makes it before its check: both then name the same directory
    lines = _refused_without_torch(args, monkeypatch, capsys)
    assert lines[0] == lines[1] and lines[0].count("\n") == 0, lines
    assert "the data cache entry would hold" in lines[0] and f"Lower {key}" in lines[0], lines[0]
    with pytest.raises(OptBenchError) as late:  # parse_args accepts it: the data pipeline refuses it, in these words
        prepare_data(parse_args(args).data, n_positions=1024)
    free = re.compile(r"has [0-9.]+ GiB free")  # the disk's free space may move between the two reads
    assert free.sub("has N GiB free", lines[0]) == free.sub("has N GiB free", f"error: {late.value}")
    assert not (tmp_path / "out").exists()


def _recipe_without(tmp_path: Path, *keys: str) -> str:
    """The quickstart recipe without ``keys`` (top-level lines), written to the test's directory."""
    lines = [ln for ln in Path(QUICK).read_text().splitlines() if not ln.startswith(tuple(f"{k}:" for k in keys))]
    path = tmp_path / f"without_{'_'.join(keys)}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("extra", [[], ["--seed", "5"], ["--optimizer", "lion", "--model_size", "mini"]],
                         ids=["defaults", "seed", "optimizer-and-size"])
def test_the_derived_output_dir_is_the_one_parse_args_derives(extra: list[str], tmp_path: Path) -> None:
    """With no output_dir named, the pre-flight derives the directory parse_args will use (the seed's default read
    from transformers' source), so it can refuse that directory's contents before torch is imported."""
    from hf_optbench.config.parse import parse_args
    from hf_optbench.run.preflight import derived_output_dir, typed_settings

    for recipe in (_recipe_without(tmp_path, "output_dir"), _recipe_without(tmp_path, "output_dir", "seed")):
        argv = [recipe, *extra]
        typed, _ = typed_settings(argv, yaml.safe_load(Path(recipe).read_text()))
        assert derived_output_dir(typed) == Path(parse_args(argv).training.output_dir)


def test_a_derived_output_dir_holding_another_tool_s_checkpoint_is_refused_before_torch(
        tmp_path: Path, monkeypatch, capsys) -> None:
    """A recipe naming no output_dir: what its derived directory (runs/<optimizer>_<size>_s<seed>) holds is
    refused by ``run`` and ``validate --full`` alike, with torch and transformers unimportable."""
    from hf_optbench.config.parse import training_annotations

    recipe = _recipe_without(tmp_path, "output_dir")
    (tmp_path / "runs" / "adamw_tiny_s0" / "checkpoint-5").mkdir(parents=True)
    (tmp_path / "runs" / "adamw_tiny_s0" / "checkpoint-5" / "trainer_state.json").write_text('{"global_step": 5}')
    monkeypatch.chdir(tmp_path)
    training_annotations()
    run_line, validate_line = _refused_without_torch([recipe], monkeypatch, capsys)
    assert run_line == validate_line
    assert "output_dir 'runs/adamw_tiny_s0' holds files no hf_optbench run wrote (checkpoint-5/)" in run_line
