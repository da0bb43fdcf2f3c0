"""Issue 41, "nothing lost, nothing hangs": sizes, files and values an adversarial user hands the installed command
are each refused in one line (exit 2), naming the setting or the file and the fix, before the work they would size
starts, and nothing in the workspace is written. Each row is a case of the issue's "What is wrong today" (items 3-5;
items 1-2, a damaged finished run and an edited checkpoint, are in tests/test_checkpoint_resume.py, which has the
real runs they need) or of the families its "What to build" names, run through ``hf-optbench`` as a user runs it, with what it did before in its comment.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from fixtures.installed import hf_optbench_command

ROOT = Path(__file__).resolve().parents[2]
QUICK = str(ROOT / "recipes" / "quickstart_cpu.yaml")
RUN = ["run", QUICK, "--output_dir", "{T}/out", "--save_strategy", "no"]
SYNTH = [*RUN, "--data_source", "synthetic"]

pytestmark = pytest.mark.slow  # one process per case


@dataclass(frozen=True)
class Hostile:
    """argv ({T}: the workspace); ``needle``: words the one error line must hold."""

    id: str
    argv: tuple[str, ...]
    needle: str


def h(id_: str, argv: list[str], needle: str) -> Hostile:
    return Hostile(id_, tuple(argv), needle)


CASES = [
    # -- item 3: sizes with no bound (each was a hang past 120 s, a traceback, or a run that started) ---------
    h("synthetic-num-tokens-1e13", [*SYNTH, "--synthetic_num_tokens", "10000000000000"],
      "78,125,000,000 training"),  # was: no answer within 120 s
    h("synthetic-hidden-nodes-1e9", [*SYNTH, "--synthetic_hidden_nodes", "1000000000"],
      "synthetic_hidden_nodes 1,000,000,000"),  # was: no answer within 120 s
    h("tuning-blocks-1e12", [*RUN, "--tuning_blocks", "1000000000000"],
      "1,000,000,000,000 tuning blocks"),  # was: no answer within 120 s
    h("synthetic-topics-1e9", [*SYNTH, "--synthetic_topics", "1000000000"],
      "tables of synthetic_topics x synthetic_vocab_size numbers"),  # was: a traceback after 68 s
    h("one-long-line", [*RUN, "--data_source", "local", "--data_files", "{T}/long_line.txt"],
      "data file '{T}/long_line.txt' line 2 holds a document of 5,000,000 characters"),  # was: rc 134 (200 MB)
    h("max-steps-1e14", [*RUN, "--max_steps", "100000000000000"],
      "max_steps must be at most 999,999,999,999"),  # was: accepted, training started
    h("max-steps-1e10", [*RUN, "--max_steps", "10000000000"], "keeps a record of every step in memory"),
    # -- item 4: files that are not files --------------------------------------------------------------------
    h("recipe-link-to-dev-zero", ["run", "{T}/zero.yaml"], "(a link to '/dev/zero') is a character device"),
    h("sweep-file-dev-zero", ["sweep", "/dev/zero", "--dry-run"], "sweep file '/dev/zero' is a character device"),
    h("recipe-fifo", ["run", "{T}/fifo.yaml"], "is a FIFO (named pipe), not a file"),  # was: a hang
    h("recipe-nested-100000", ["run", "{T}/nested.yaml"], "nested more than 32 levels"),  # was: RecursionError
    h("kwargs-nested-100000", ["run", "{T}/kwargs_nested.yaml"], "optimizer_kwargs holds values nested more than"),
    h("parquet-truncated", [*RUN, "--data_source", "local", "--data_files", "{T}/truncated.parquet"],
      "data file '{T}/truncated.parquet' is a damaged Parquet file"),  # was: a traceback
    # -- item 5: unclear messages ------------------------------------------------------------------------------
    h("init-from-pickle-payload", [*RUN, "--init_from", "{T}/evil"],
      "pytorch_model.bin is a pickle that torch's safe loader refuses"),  # was: a traceback after the data
    h("init-from-auto-map", [*RUN, "--init_from", "{T}/custom"],
      "config.json asks for custom modelling code (auto_map"),  # was: loaded as plain GPT-2, no word said
    h("weight-decay-minus-inf", [*RUN, "--weight_decay", "-inf"],
      "weight_decay must be a finite number, got -inf"),  # was: "expected one argument"
    # -- item 1's neighbour: a run stopped before its first checkpoint (its records would be replaced) ------------
    h("output-dir-holds-a-stopped-run", ["run", QUICK, "--output_dir", "{T}/stopped"],
      "holds an earlier run that did not finish (metrics.jsonl up to step 3, no summary.json)"),
    # -- custom code in a directory the run loads: refused by name, never run, even with "y" on stdin --------------
    h("tokenizer-custom-code", [*RUN, "--tokenizer_name", "{T}/evil_tok"],
      "{T}/evil_tok/tokenizer_config.json asks for custom tokenizer code (auto_map"),  # was: evil_tok.py ran on "y"
    # -- another tool's Trainer checkpoint and a user's README.md: never deleted, overwrite or not ------------------
    h("output-dir-foreign-checkpoint", ["run", QUICK, "--output_dir", "{T}/foreign"],
      "holds files no hf_optbench run wrote (checkpoint-100/, README.md)"),  # was: "checkpoints of an unfinished run"
    h("output-dir-foreign-checkpoint-overwrite", ["run", QUICK, "--output_dir", "{T}/foreign", "--overwrite_output_dir",
                                                  "true"], "also with --overwrite_output_dir true"),  # was: both deleted
    # -- num_train_epochs bounded as max_steps is -------------------------------------------------------------------
    h("epochs-inf", ["run", "{T}/epochs_inf.yaml"], "num_train_epochs (in recipe"),  # was: OverflowError
    h("epochs-1e12", ["run", "{T}/epochs_1e12.yaml"], "must be at most 999,999,999,999"),  # was: 8.2e15 steps began
    h("epochs-1e10", ["run", "{T}/epochs_1e10.yaml"], "keeps a record of every step in memory"),  # counted, then bound
    # -- a second tuning draw's cell in a sweep of one data ratio --------------------------------------------------
    h("second-draw-ratio-abc", ["sweep", "{T}/draw_abc.yaml", "--dry_run"],
      "tokens_per_param 'abc' is not the sweep's one data ratio"),  # was: a ValueError
    h("second-draw-ratio-list", ["sweep", "{T}/draw_list.yaml", "--dry_run"],
      "tokens_per_param [0.5] is not the sweep's one data ratio"),  # was: a TypeError
    # -- a line break in a run's output_dir: refused as in a SLURM sweep's ---------------------------------------------
    h("run-output-dir-line-break", ["run", QUICK, "--output_dir", "{T}/a\nb"],
      "output_dir holds a line break"),  # was: accepted; its config.yaml did not rerun ("not valid YAML")
    h("report-output-line-break", ["report", "{T}/evil", "--output", "{T}/r\nx"], "--output holds a line break"),
    # -- shell injection into the SLURM job script a sweep has submitit write ------------------------------------
    h("slurm-output-dir-line-break", ["sweep", "{T}/slurm_newline.yaml", "--dry-run"],
      "output_dir holds a line break"),
]


def _tiny_model_dir(root: Path, *, payload: bool = False, auto_map: bool = False) -> None:
    """A GPT-2 of one layer: pytorch_model.bin a pickle whose unpickling would run ``touch RAN`` (``payload``), or
    model.safetensors under a config.json that asks for custom code (``auto_map``)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    root.mkdir()
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=1, n_embd=8, vocab_size=64, n_positions=16))
    model.save_pretrained(root)
    if payload:
        (root / "model.safetensors").unlink()
        torch.save({"x": _Payload(str(root / "RAN"))}, root / "pytorch_model.bin")
    if auto_map:
        config = json.loads((root / "config.json").read_text())
        config["auto_map"] = {"AutoModelForCausalLM": "modeling_mine.MyLM"}
        (root / "config.json").write_text(json.dumps(config))


def _custom_code_tokenizer(root: Path) -> None:
    """The bundled tokenizer, its tokenizer_config.json pointing AutoTokenizer at ``evil_tok.py``, whose import
    would create ``RAN`` beside it (transformers runs it when trust_remote_code is on or a "y" is typed)."""
    import shutil

    from hf_optbench.data.tokenizers import builtin_tokenizers

    shutil.copytree(builtin_tokenizers()["thai-bpe-2k"], root)
    config = json.loads((root / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": [None, "evil_tok.EvilTokenizer"]}
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    (root / "evil_tok.py").write_text(
        f"import pathlib\npathlib.Path({str(root / 'RAN')!r}).touch()\n"
        "from transformers import PreTrainedTokenizerFast\n\n\n"
        "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n")


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    (root / "zero.yaml").symlink_to("/dev/zero")
    os.mkfifo(root / "fifo.yaml")
    (root / "nested.yaml").write_text("model_size: " + "[" * 100_000 + "]" * 100_000 + "\n")
    (root / "kwargs_nested.yaml").write_text(f"output_dir: {root}/out\ntokenizer_name: builtin:thai-bpe-2k\n"
                                             "optimizer_kwargs: '"
                                             + '{"a": ' * 50_000 + "1" + "}" * 50_000 + "'\n")
    # one line of 5 million characters (the was 200 MB: the same refusal, at the same place)
    (root / "long_line.txt").write_text("a short first line\n" + "ก" * 5_000_000 + "\nand a last one\n",
                                        encoding="utf-8")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [f"สวัสดีครับ ทดสอบ {i} " * 20 for i in range(500)]}), root / "t.parquet")
    data = (root / "t.parquet").read_bytes()
    (root / "truncated.parquet").write_bytes(data[: len(data) // 2])  # its leading magic bytes kept
    (root / "t.parquet").unlink()
    _tiny_model_dir(root / "evil", payload=True)
    _tiny_model_dir(root / "custom", auto_map=True)
    _custom_code_tokenizer(root / "evil_tok")
    quick = [line for line in Path(QUICK).read_text().splitlines() if not line.startswith(("max_steps", "output_dir"))]
    for name, epochs in (("inf", ".inf"), ("1e12", "1.0e12"), ("1e10", "1.0e10")):
        (root / f"epochs_{name}.yaml").write_text("\n".join([*quick, f"num_train_epochs: {epochs}",
                                                             f"output_dir: {root}/out", "save_strategy: 'no'"]) + "\n")
    (root / "foreign" / "checkpoint-100").mkdir(parents=True)
    (root / "foreign" / "checkpoint-100" / "trainer_state.json").write_text(json.dumps({"global_step": 100}))
    (root / "foreign" / "checkpoint-100" / "model.safetensors").write_bytes(b"weights of another tool")
    (root / "foreign" / "README.md").write_text("my notes\n")
    (root / "stopped").mkdir()
    (root / "stopped" / "run_identity.json").write_text(json.dumps({"identity": {"max_steps": 50}}))
    (root / "stopped" / "metrics.jsonl").write_text("".join(json.dumps({"kind": "train", "step": s}) + "\n"
                                                            for s in (1, 2, 3)))
    for name, tpp in (("abc", "abc"), ("list", "[0.5]")):
        (root / f"draw_{name}.yaml").write_text(
            f"base: {QUICK}\noutput_dir: {root}/sw\nmatrix: {{optimizer: [adamw], model_size: [tiny], seed: [1]}}\n"
            "budget: {tokens_per_param: 0.5}\nlauncher: {type: python}\n"
            "tune: {seed: 0, lr_multipliers: [0.5, 1, 2], second_draw: {seed: 6, cells: [{model_size: tiny, "
            f"tokens_per_param: {tpp}}}]}}}}\n")
    (root / "slurm_newline.yaml").write_text(
        f"base: {QUICK}\noutput_dir: \"{root}/sw\\ntouch {root}/PWNED\\n\"\n"
        "matrix: {optimizer: [adamw], model_size: [tiny], seed: [0]}\n"
        "launcher: {type: python, executor: slurm, slurm: {cluster: local, timeout_min: 5}}\n")
    return root


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in root.rglob("*")
            if p.relative_to(root).parts[0] != "cache"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_hostile_input_is_one_line_and_exit_2_through_the_installed_command(case: Hostile,
                                                                                 workspace: Path) -> None:
    exe = hf_optbench_command()
    argv = [a.replace("{T}", str(workspace)) for a in case.argv]
    before = _snapshot(workspace)
    proc = subprocess.run([str(exe), *argv], capture_output=True, text=True, cwd=workspace, timeout=300, input="y\n",
                          env={**os.environ, "HF_OPTBENCH_CACHE": str(workspace / "cache"), "HF_HUB_OFFLINE": "1"})
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("[INFO]")]
    print(f"{case.id}: rc {proc.returncode}: {' | '.join(lines)[:600]}")  # what the user saw (pytest -s)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert case.needle.replace("{T}", str(workspace)) in lines[0], lines[0]
    assert _snapshot(workspace) == before, "files written or changed"
    assert not (workspace / "evil" / "RAN").exists() and not (workspace / "PWNED").exists()
    assert not (workspace / "evil_tok" / "RAN").exists(), "the tokenizer's custom code ran"


# -- validate --full as strict as run: one refusal, through the same checks; those that need no model, before torch
NO_TOKENIZER_KEY = "no_tokenizer.yaml"  # the quickstart recipe without tokenizer_name: the Hub default, not cached
STRICT = [
    (["{T}/" + NO_TOKENIZER_KEY], "--tokenizer_name builtin:thai-bpe-2k", False),
    ([QUICK, "--output_dir", "{T}/o", "--fp16", "true"], "fp16 true, which needs a GPU", False),
    ([QUICK, "--output_dir", "{T}/o", "--push_to_hub", "true"], "push_to_hub is set but HF_HUB_OFFLINE is on", False),
    ([QUICK, "--output_dir", "{T}/o", "--optimizer", "muon", "--optimizer_kwargs", '{"ns_precision": "half"}'],
     "ns_precision 'half' is not one of auto, bf16, fp32", False),
]
PROBE = ("import sys\nfrom hf_optbench.cli import main\nrc = main(sys.argv[1:])\n"
         "print('torch imported:', 'torch' in sys.modules)\nsys.exit(rc)\n")


@pytest.mark.parametrize(("argv", "needle", "torch"), STRICT, ids=["tokenizer-offline", "fp16-cpu", "push-offline",
                                                                   "muon-ns-half"])
def test_validate_full_refuses_what_run_refuses(argv: list[str], needle: str, torch: bool, workspace: Path) -> None:
    """The installed command's ``run`` and ``validate --full`` give the same one line; a refusal that needs no
    model answers before torch is imported (the same entry point, in a process of its own, says whether it was)."""
    import sys

    (workspace / NO_TOKENIZER_KEY).write_text("".join(
        line + "\n" for line in Path(QUICK).read_text().splitlines() if not line.startswith(("tokenizer_name",
                                                                                           "output_dir")))
        + f"output_dir: {workspace}/o\n")
    args = [a.replace("{T}", str(workspace)) for a in argv]
    env = {**os.environ, "HF_OPTBENCH_CACHE": str(workspace / "cache"), "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(workspace / "hf_home")}  # an empty Hugging Face cache: the default tokenizer is not in it
    lines = {}
    for command in (["run", *args], ["validate", *args, "--full"]):
        proc = subprocess.run([str(hf_optbench_command()), *command], capture_output=True, text=True, env=env,
                              cwd=workspace, timeout=300)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert needle in errors[0], errors[0]
        lines[command[0]] = errors[0]
    assert lines["run"] == lines["validate"]
    probe = subprocess.run([sys.executable, "-c", PROBE, "validate", *args, "--full"], capture_output=True, text=True,
                           env=env, cwd=workspace, timeout=300)
    assert probe.returncode == 2 and f"torch imported: {torch}" in probe.stdout, probe.stdout + probe.stderr[-2000:]
    assert not (workspace / "o").exists()
