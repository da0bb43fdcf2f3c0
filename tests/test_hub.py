"""redact.py, card.py, hub.py and `hf-optbench push`: secrets scrubbing, model card from summary.json, the
staged upload folder and its checks, the upload call (with the network replaced), and a real run that must not
write a token anywhere."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_optbench.cli import push
from hf_optbench.errors import OptBenchError
from hf_optbench.publish import card as card_mod
from hf_optbench.publish import content, hub, redact, stage

from fixtures.hub_run import SUMMARY, fake_run
from fixtures.installed import hf_optbench_command
from fixtures.warm_run import run_python

ROOT = Path(__file__).resolve().parents[1]
FAKE_TOKEN = "hf_" + "Ab3" * 12  # token-shaped, 39 characters, never valid
# ---------------------------------------------------------------------------------------------- scrub_secrets


def test_scrub_secrets_drops_secret_keys_and_redacts_token_strings() -> None:
    cfg = {
        "hub_token": "anything",
        "learning_rate": 3e-4,
        "eos_token": "<|endoftext|>",
        "pad_token_id": 0,
        "run_name": f"try {FAKE_TOKEN} x",
        "nested": {"HF_TOKEN": "x", "list": [FAKE_TOKEN, "ok", (FAKE_TOKEN, 1)]},
        "short": "hf_abc",
    }
    out = redact.scrub_secrets(cfg)
    assert "hub_token" not in out and "HF_TOKEN" not in out["nested"]
    assert out["learning_rate"] == 3e-4 and out["eos_token"] == "<|endoftext|>" and out["pad_token_id"] == 0
    assert out["run_name"] == "try <redacted> x"
    assert out["nested"]["list"] == ["<redacted>", "ok", ("<redacted>", 1)]
    assert out["short"] == "hf_abc"  # too short to be a token
    assert FAKE_TOKEN not in json.dumps(out, default=str)
    assert cfg["hub_token"] == "anything", "the input must not be mutated"


# ------------------------------------------------------------------------------------------------- model card


def test_model_card_carries_the_benchmark_summary(tmp_path: Path) -> None:
    from huggingface_hub import ModelCard

    run = fake_run(tmp_path)
    path = card_mod.write_model_card(run, repo_id="me/tiny-lion")
    card = ModelCard.load(path)
    data = card.data.to_dict()
    assert data["library_name"] == "transformers" and "hf-optbench" in data["tags"] and "lion" in data["tags"]
    assert data["hf_optbench"]["optimizer"] == "lion" and data["hf_optbench"]["tokens_seen"] == 40960
    metrics = {m["type"]: m["value"] for r in data["model-index"][0]["results"] for m in r["metrics"]}
    assert metrics["loss"] == pytest.approx(5.6789)
    assert metrics["perplexity"] == pytest.approx(math.exp(5.6789))
    text = card.text
    for expected in ("# tiny-lion", "lion_pytorch.Lion", "123,456", "40,960", "5.432", "5.679", "3.00 GiB",
                     "482.25 KiB", "12,346 tokens/s", "hf-optbench run recipes/quickstart_cpu.yaml"):
        assert expected in text, expected


def test_model_card_says_what_ran_and_how_to_rerun_it(tmp_path: Path) -> None:
    """The setup table holds the optimizer's values as it ran them (per group where groups differ), a 12 ms median
    step reads as such (not "0.0 s"), and Reproduce is the run's own config.yaml."""
    import yaml

    ran = {**SUMMARY, "step_time_median_s": 0.0123, "weight_decay": 0.3,
           "hyperparameters": {"learning_rate": {"value": 1e-4, "source": "user"},
                               "weight_decay": {"value": 0.3, "source": "cited"},
                               "betas": {"value": [0.9, 0.99], "source": "cited"},
                               "max_grad_norm": {"value": 1.0, "source": "cited"}},
           "param_groups": [{"lr": 1e-4, "weight_decay": 0.3, "tensors": 10},
                            {"lr": 1e-4, "weight_decay": 0.0, "tensors": 18}]}
    run = fake_run(tmp_path, summary=ran)
    (run / "config.yaml").write_text(yaml.safe_dump({"output_dir": "runs/tiny_lion", "optimizer": "lion"}))
    text = card_mod.write_model_card(run).read_text()
    assert "| median step time | 0.0123 s |" in text
    assert "| weight decay | 0.3 on 10 tensors, 0 on 18 tensors |" in text
    assert "| optimizer hyperparameters | betas [0.9, 0.99], max_grad_norm 1.0 |" in text
    assert "hf-optbench run runs/tiny_lion/config.yaml --output_dir runs/tiny_lion_rerun" in text


def test_a_multi_process_runs_card_reruns_it_under_its_launcher(tmp_path: Path) -> None:
    """Issue 39: the card of a 2-process run said `hf-optbench run .../config.yaml`, which runs 1 process."""
    import yaml

    launch = {"processes": 2, "launcher": "accelerate launch", "rerun_prefix":
              "accelerate launch --config_file accelerate_configs/cpu_ddp2.yaml"}
    run = fake_run(tmp_path, summary={**SUMMARY, "launch": launch})
    (run / "config.yaml").write_text(yaml.safe_dump({"output_dir": "runs/ddp2", "optimizer": "lion"}))
    text = card_mod.write_model_card(run).read_text()
    assert ("accelerate launch --config_file accelerate_configs/cpu_ddp2.yaml -m hf_optbench.run "
            "runs/ddp2/config.yaml --output_dir runs/ddp2_rerun") in text
    assert "hf-optbench run runs/ddp2" not in text


def test_a_python_api_runs_card_and_push_say_what_is_missing(tmp_path: Path, capsys) -> None:
    """Issue 39: a Trainer script's run (no config.yaml, no recipe, no tokenizer) got "Reproduce: hf-optbench run
    RECIPE.yaml" and a dry run that said only "checks passed"."""
    api = {k: v for k, v in SUMMARY.items() if k != "recipe"}
    run = fake_run(tmp_path, summary=api)
    for ck in run.glob("checkpoint-*"):
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (ck / name).unlink()
    text = card_mod.write_model_card(run).read_text()
    assert card_mod.NOT_REPRODUCIBLE in text and "RECIPE.yaml" not in text
    assert push.main([str(run), "--repo-id", "me/api", "--dry-run"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    assert len(notes) == 2 and "no config.yaml" in notes[0] and "no tokenizer files" in notes[1]


def test_model_card_with_missing_figures_says_na(tmp_path: Path) -> None:
    run = fake_run(tmp_path, summary={"optimizer": "adamw", "model_size": "tiny", "status": "failed",
                                       "final_eval_loss": None, "mfu": None})
    text = card_mod.write_model_card(run).read_text()
    assert "| final eval loss | n/a |" in text and "| MFU | n/a |" in text
    assert "model-index" not in text  # no eval result to publish


def _card_meta(run: Path, config: dict | None, data: dict) -> tuple[dict, list]:
    """Write config.yaml and summary.json's data block, build the card, and read it back with huggingface_hub's own
    parsers: metadata_load (the YAML) and ModelCard.load (ModelCardData, model-index -> EvalResult)."""
    import yaml
    from huggingface_hub import ModelCard, metadata_load

    if config is not None:
        (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "summary.json").write_text(json.dumps({**SUMMARY, "data": data}))
    path = card_mod.write_model_card(run, repo_id="me/tiny-lion")
    card = ModelCard.load(path)  # raises on a model-index huggingface_hub cannot parse
    assert card.data.model_name == "tiny-lion"
    return metadata_load(path), card.data.eval_results


def test_the_card_states_the_license_the_run_set_and_its_clipping(tmp_path: Path) -> None:
    config = {"data_source": "thai_sample", "model_card_license": "mit"}
    meta, _ = _card_meta(fake_run(tmp_path), config, {"data_source": "thai_sample"})
    assert meta["license"] == "mit"
    (tmp_path / "b").mkdir()
    card = str(card_mod.build_model_card(fake_run(tmp_path / "b"), summary={**SUMMARY, "max_grad_norm": 1.0}))
    assert "| gradient clipping | max norm 1 |" in card, card
    card = str(card_mod.build_model_card(tmp_path / "b" / "run", summary={**SUMMARY, "max_grad_norm": 0.0}))
    assert "| gradient clipping | off |" in card


def test_model_card_follows_the_hub_conventions_for_mc4_thai(tmp_path: Path) -> None:
    config = {"data_source": "hub", "dataset_name": "allenai/c4", "dataset_config": "th", "dataset_split": "train"}
    data = {"data_source": "hub", "source": "hub: allenai/c4/th split train (streamed)", "split_seed": 1234,
            "eval_tokens": 8192, "block_size": 128}
    meta, results = _card_meta(fake_run(tmp_path), config, data)
    assert "license" not in meta  # the weights' license is the user's to choose: none unless set
    assert meta["language"] == ["th"] and meta["datasets"] == ["allenai/c4"]
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "text-generation"
    assert {"hf-optbench", "lion"} <= set(meta["tags"])
    assert {(r.task_type, r.dataset_type, r.dataset_config, r.dataset_split) for r in results} == {
        ("text-generation", "allenai/c4", "th", "train")}
    assert results[0].dataset_name == "mC4 Thai (allenai/c4, config th)"
    assert results[0].dataset_args == {"split_seed": 1234, "eval_tokens": 8192, "block_size": 128}
    metrics = {r.metric_type: r.metric_value for r in results}
    # evaluation results only; tokens, parameters and bytes are training facts, in the hf_optbench block
    assert metrics == {"loss": pytest.approx(5.6789), "perplexity": pytest.approx(math.exp(5.6789))}
    facts = meta["hf_optbench"]
    assert (facts["tokens_seen"], facts["num_params"], facts["optimizer_state_bytes_total"],
            facts["peak_memory_bytes"]) == (40960, 123456, 493824, 3 * 2**30)
    assert all(r.metric_args == {"optimizer": "lion", "model_size": "tiny"} for r in results)
    assert "lion" in results[0].task_name and "tiny" in results[0].task_name


@pytest.mark.parametrize("config, data, dataset_type, language, name_has", [
    ({"data_source": "synthetic"}, {"data_source": "synthetic", "source": "synthetic: HMM graph V=32 K=4 seed=0"},
     "synthetic-hmm", None, "HMM graph V=32"),
    ({"data_source": "local", "dataset_config": "th", "dataset_split": "train"},
     {"data_source": "local", "source": "local: 2 json file(s) (c4 layout)"}, "local-files", ["th"], "c4 layout"),
    ({"data_source": "local", "dataset_config": "th"}, {"data_source": "local", "source": "local: 1 text file(s)"},
     "local-files", None, "1 text file"),
    ({"data_source": "thai_sample"}, {"data_source": "thai_sample", "source": "thai_sample: 1 json file(s)"},
     "hf-optbench-thai-sample", ["th"], "bundled Thai sample"),
    (None, {"data_source": "synthetic", "source": "synthetic: HMM graph V=8"}, "synthetic-hmm", None, "V=8"),
], ids=["synthetic", "local-c4-layout", "local-text", "thai-sample", "no-config-yaml"])
def test_model_card_never_claims_c4_for_other_data(tmp_path: Path, config, data, dataset_type, language,
                                                   name_has) -> None:
    meta, results = _card_meta(fake_run(tmp_path), config, data)
    assert "datasets" not in meta and "allenai/c4" not in json.dumps(meta)
    assert meta.get("language") == language
    assert {r.dataset_type for r in results} == {dataset_type} and name_has in results[0].dataset_name
    assert name_has in (tmp_path / "run" / "README.md").read_text().split("---", 2)[2]  # the body's data row


def test_model_card_for_a_checkpoint_in_progress(tmp_path: Path) -> None:
    import yaml

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"optimizer": "lion", "model_size": "tiny", "seed": 3}))
    (run / "metrics.jsonl").write_text('{"kind": "train", "step": 2, "tokens": 2048, "loss": 6.5}\n'
                                       '{"kind": "train", "step": 3, "tokens": 3072, "loss": 6.4}\n')
    summary = card_mod.progress_summary(run, 2, [{"loss": 6.5, "step": 2}, {"eval_loss": 6.7, "step": 2}])
    assert summary == {"optimizer": "lion", "model_size": "tiny", "seed": 3, "steps": 2, "status": "in progress",
                       "final_train_loss": 6.5, "final_eval_loss": 6.7, "tokens_seen": 2048}
    text = str(card_mod.build_model_card(run, "me/x", summary=summary))
    assert "Training in progress: figures at step 2" in text and "| tokens seen | 2,048 |" in text


def test_model_card_needs_a_summary(tmp_path: Path) -> None:
    with pytest.raises(OptBenchError, match="summary.json"):
        card_mod.write_model_card(tmp_path)


# ---------------------------------------------------------------------------------------------- upload folder


def test_stage_takes_the_latest_checkpoint_and_no_pickles(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    run = fake_run(tmp_path)
    staged = stage.stage_upload_folder(run, repo_id="me/tiny-lion", token=FAKE_TOKEN)
    assert staged == run / "hub_upload"
    names = {p.name for p in staged.iterdir()} - {stage.STAGE_MARKER}
    assert names == {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                     "tokenizer_config.json", "README.md", "metrics.jsonl", "summary.json"}
    assert float(load_file(str(staged / "model.safetensors"))["w"][0, 0]) == 10.0  # checkpoint-10, not -2
    assert json.loads((staged / "summary.json").read_text())["optimizer"] == "lion"
    assert stage.check_upload_folder(staged, token=FAKE_TOKEN) == []
    # staging again replaces the folder it made
    assert stage.stage_upload_folder(run, token=FAKE_TOKEN) == staged


def test_stage_refuses_a_token_in_any_file(tmp_path: Path) -> None:
    run = fake_run(tmp_path)
    (run / "checkpoint-10" / "tokenizer_config.json").write_text(json.dumps({"token": FAKE_TOKEN}))
    with pytest.raises(OptBenchError, match="tokenizer_config.json: contains a Hugging Face token"):
        stage.stage_upload_folder(run, token="unrelated-value")


def test_stage_refuses_the_known_token_even_if_not_hf_shaped(tmp_path: Path) -> None:
    run = fake_run(tmp_path)
    (run / "checkpoint-10" / "config.json").write_text(json.dumps({"note": "my-org-secret-42"}))
    with pytest.raises(OptBenchError, match="config.json: contains a Hugging Face token"):
        stage.stage_upload_folder(run, token="my-org-secret-42")


def test_check_flags_pickles_and_corrupt_safetensors(tmp_path: Path) -> None:
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04")
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    problems = stage.check_upload_folder(folder, token=None)
    assert any("pytorch_model.bin: pickled" in p for p in problems)
    assert any("model.safetensors: not a readable safetensors" in p for p in problems)
    assert "missing config.json" in problems and "missing README.md" in problems


def test_check_flags_pickles_by_content_whatever_the_name(tmp_path: Path) -> None:
    import torch

    folder = tmp_path / "f"
    folder.mkdir()
    torch.save({"w": torch.zeros(2)}, folder / "notes.txt")  # torch's zip format, holding data.pkl
    torch.save({"w": torch.zeros(2)}, folder / "vocab.json", _use_new_zipfile_serialization=False)  # raw pickle
    (folder / "ok.json").write_text('{"a": 1}')
    problems = stage.check_upload_folder(folder, token=None)
    assert any(p.startswith("notes.txt: holds a pickle") for p in problems)
    assert any(p.startswith("vocab.json: holds a pickle") for p in problems)
    assert not any(p.startswith("ok.json") for p in problems)


def test_check_flags_every_pickle_protocol_by_content_and_passes_ordinary_files(tmp_path: Path) -> None:
    """Protocols 0 and 1 are text-like opcodes (no 0x80 byte in front): a stream of them is a pickle too, small or
    larger than the bytes the check parses. Text, JSON, Markdown and safetensors beside them still pass."""
    import pickle

    import torch
    from safetensors.torch import save_file

    folder = tmp_path / "f"
    folder.mkdir()
    for protocol in range(6):
        (folder / f"notes{protocol}.txt").write_bytes(pickle.dumps({"lr": 3e-4, "betas": [0.9, 0.95]}, protocol))
        (folder / f"big{protocol}.txt").write_bytes(pickle.dumps(["x" * 1000] * 2000, protocol))  # ~2 MB
    texts = {"notes.txt": "hello world\n", "config.json": '{"n_layer": 2}', "README.md": "---\nlicense: mit\n---\n",
             "merges.txt": "#version: 0.2\nG t\n", "empty.txt": "", "numbers.txt": "12345\n", "aside.txt": "(see it)\n",
             "chat_template.jinja": "{% for m in messages %}{{ m }}{% endfor %}"}
    for name, text in texts.items():
        (folder / name).write_text(text, encoding="utf-8")
    save_file({"w": torch.zeros(64, 64)}, str(folder / "model.safetensors"))
    problems = stage.check_upload_folder(folder, token=None)
    flagged = sorted(p.split(":")[0] for p in problems if "holds a pickle" in p)
    assert flagged == sorted(f"{kind}{n}.txt" for kind in ("notes", "big") for n in range(6)), problems


def test_stage_needs_safetensors_weights(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(SUMMARY))
    (run / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(OptBenchError, match="no safetensors weights.*pytorch_model.bin"):
        stage.stage_upload_folder(run)


def test_stage_will_not_delete_a_folder_it_did_not_make(tmp_path: Path) -> None:
    run = fake_run(tmp_path)
    mine = tmp_path / "precious"
    mine.mkdir()
    (mine / "keep.txt").write_text("x")
    with pytest.raises(OptBenchError, match="no earlier staging by hf-optbench wrote: keep.txt"):
        stage.stage_upload_folder(run, mine, token=FAKE_TOKEN)
    assert (mine / "keep.txt").is_file()


# ------------------------------------------------ what may be staged: links, outside paths, hidden pickles, secrets
NETRC = "machine example.com\n  login me\n  password hunter2\n"
AWS = "[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCY\n"


def _secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "netrc"
    path.parent.mkdir(exist_ok=True)
    path.write_text(NETRC)
    return path


def _link(path: Path, target: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to(target)


def _index(run: Path, shard: str) -> None:
    (run / "checkpoint-10" / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {"w": "model.safetensors", "v": shard}}))


def _outside_checkpoint(run: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(run / "checkpoint-10", tmp_path / "outside" / "checkpoint"))


def _object_npy(path: Path) -> None:
    import numpy as np

    with path.open("wb") as fh:  # np.save on a path would append .npy
        np.save(fh, np.array([{"lr": 3e-4}], dtype=object), allow_pickle=True)


def _gzipped_pickle(path: Path) -> None:
    import gzip
    import pickle

    path.write_bytes(gzip.compress(pickle.dumps({"lr": 3e-4})))


# (how the run directory is spoiled, what the one error line must say); issue 32 items 5 and 6
UNSAFE = {
    "symlinked-tokenizer": (lambda run, tmp: _link(run / "checkpoint-10" / "tokenizer.json", _secret_file(tmp)),
                            "tokenizer.json' is a symbolic link"),
    "symlinked-merges": (lambda run, tmp: _link(run / "merges.txt", _secret_file(tmp)), "merges.txt' is a symbolic link"),
    "symlinked-metrics": (lambda run, tmp: _link(run / "metrics.jsonl", _secret_file(tmp)),
                          "metrics.jsonl' is a symbolic link"),
    "symlinked-checkpoint": (lambda run, tmp: _link(run / "checkpoint-12", _outside_checkpoint(run, tmp)),
                             "lies outside the run directory"),
    "index-absolute-path": (lambda run, tmp: _index(run, str(_secret_file(tmp))), "not a .safetensors file beside"),
    "index-parent-path": (lambda run, tmp: _index(run, "../../outside/netrc"), "names '../../outside/netrc'"),
    "netrc-content": (lambda run, tmp: (run / "checkpoint-10" / "tokenizer_config.json").write_text(NETRC),
                      "tokenizer_config.json: contains netrc credentials"),
    "aws-content": (lambda run, tmp: (run / "checkpoint-10" / "generation_config.json").write_text(AWS),
                    "generation_config.json: contains an AWS access key id"),
    "pickle-in-object-npy": (lambda run, tmp: _object_npy(run / "checkpoint-10" / "vocab.json"),
                             "vocab.json: holds a pickle in an object-dtype .npy array"),
    "pickle-in-gzip": (lambda run, tmp: _gzipped_pickle(run / "merges.txt"),
                       "merges.txt: holds a pickle in gzip-compressed content"),
}


@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_push_dry_run_refuses_what_must_not_leave_the_machine(tmp_path: Path, case: str, capsys) -> None:
    """Before: "checks passed", and the link's target, the shard index's outside path, the netrc or AWS secret and
    the pickle inside an .npy or a gzip were staged for upload. Now: exit 2, one line naming the file and why,
    nothing written."""
    from hf_optbench import cli

    run = fake_run(tmp_path)
    (tmp_path / "outside").mkdir()
    spoil, needle = UNSAFE[case]
    spoil(run, tmp_path)
    before = _tree(tmp_path)
    rc = cli.main(["push", str(run), "--repo-id", "me/x", "--dry-run"])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
    assert "hunter2" not in out + err and _tree(tmp_path) == before


def test_push_through_the_installed_command_refuses_a_symlink(tmp_path: Path) -> None:
    exe = hf_optbench_command()
    run = fake_run(tmp_path)
    _link(run / "checkpoint-10" / "tokenizer.json", _secret_file(tmp_path))
    proc = subprocess.run([str(exe), "push", str(run), "--repo-id", "me/x", "--dry-run"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "symbolic link" in proc.stderr, proc.stderr
    assert "checks passed" not in proc.stdout and not (run / "hub_upload").exists()


def test_pickle_checks_look_inside_archives_and_compressed_streams(tmp_path: Path) -> None:
    import bz2
    import lzma
    import pickle
    import zipfile

    import numpy as np

    blob = pickle.dumps({"lr": 3e-4})
    (tmp_path / "a.txt").write_bytes(bz2.compress(blob))
    (tmp_path / "b.txt").write_bytes(lzma.compress(blob))
    with zipfile.ZipFile(tmp_path / "c.json", "w") as z:  # a pickle member under an innocent name
        z.writestr("notes/data", blob)
    with zipfile.ZipFile(tmp_path / "d.model", "w") as z:  # np.savez: a zip of .npy, one of them object dtype
        with z.open("x.npy", "w") as fh:
            np.save(fh, np.array([None, {"a": 1}], dtype=object), allow_pickle=True)
    for name, where in (("a.txt", "bz2-compressed content"), ("b.txt", "xz-compressed content"),
                        ("c.json", "zip member notes/data"), ("d.model", "zip member x.npy")):
        assert content.pickle_in(tmp_path / name) == where if "zip" not in where else \
            content.pickle_in(tmp_path / name).startswith(where), (name, content.pickle_in(tmp_path / name))
    with (tmp_path / "plain.npy").open("wb") as fh:  # a numeric array is no pickle
        np.save(fh, np.arange(4))
    assert content.pickle_in(tmp_path / "plain.npy") is None


def test_staged_card_and_config_name_no_local_path(tmp_path: Path) -> None:
    """Issue 33: the staged card's Reproduce line named this machine's run directory; it reruns the repository's own
    config.yaml now, whose output_dir is the run's name."""
    run = fake_run(tmp_path)
    (run / "config.yaml").write_text(f"# rerun: hf-optbench run {run}/config.yaml --output_dir NEW_DIR\n"
                                     f"output_dir: {run}\noptimizer: lion\n")
    staged = stage.stage_upload_folder(run, tmp_path / "st", repo_id="me/tiny-lion", token=FAKE_TOKEN)
    card, config = (staged / "README.md").read_text(), (staged / "config.yaml").read_text()
    assert "hf-optbench run config.yaml --output_dir run_rerun" in card
    assert str(tmp_path) not in card and str(tmp_path) not in config and "output_dir: run\n" in config
    assert f"--output_dir {run}_rerun" in card_mod.write_model_card(run).read_text()  # the local card: local paths


# ------------------------------------------------------------------------------------------------------ push


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lift the suite's HF_HUB_OFFLINE; the network itself stays unreachable (calls are recorded instead)."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def test_push_offline_gives_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = fake_run(tmp_path)
    with pytest.raises(OptBenchError, match="HF_HUB_OFFLINE.*--dry_run"):
        hub.push_run(run, "me/tiny-lion", token=FAKE_TOKEN)


def test_push_without_token_gives_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, online) -> None:
    import huggingface_hub

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(OptBenchError, match="no Hugging Face token.*HF_TOKEN"):
        hub.push_run(fake_run(tmp_path), "me/tiny-lion")


@pytest.mark.parametrize("repo_id", ["no-owner", "me/bad name", "me/x/y"])
def test_push_rejects_bad_repo_ids(tmp_path: Path, repo_id: str) -> None:
    with pytest.raises(OptBenchError, match="repo_id"):
        hub.push_run(tmp_path, repo_id, token=FAKE_TOKEN)


def test_push_calls_huggingface_hub_with_the_staged_folder_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   online, capsys) -> None:
    from huggingface_hub import HfApi

    calls: dict = {}

    def create_repo(self, repo_id, **kw):
        calls["create"] = (repo_id, kw, self.token)

    def upload_folder(self, **kw):
        calls["upload"] = dict(kw, files=sorted(p.name for p in Path(kw["folder_path"]).iterdir()))
        return type("CommitInfo", (), {"commit_url": "https://huggingface.co/me/tiny-lion/commit/1"})()

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    run = fake_run(tmp_path)

    assert push.main([str(run), "--repo-id", "me/tiny-lion"]) == 0
    repo_id, kw, token = calls["create"]
    assert repo_id == "me/tiny-lion" and kw["private"] is True and kw["exist_ok"] is True and token == FAKE_TOKEN
    up = calls["upload"]
    staged = Path(up["folder_path"])  # a temporary folder beside the run, gone afterwards: the run is not written
    assert up["repo_id"] == "me/tiny-lion" and staged.parent.name.startswith(".hf_optbench_stage-")
    assert not staged.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert "model.safetensors" in up["files"] and "README.md" in up["files"]
    assert not any(f.endswith((".bin", ".pt", ".pth")) for f in up["files"])
    assert "lion" in up["commit_message"]
    out = capsys.readouterr()
    assert "private" in out.out and FAKE_TOKEN not in out.out + out.err

    push.main([str(run), "--repo-id", "me/tiny-lion", "--public"])
    assert calls["create"][1]["private"] is False


@pytest.mark.parametrize("argv", [
    ["--token", "hf_SECRETVALUE"], ["--token=hf_SECRETVALUE"], ["--hub-token", "hf_SECRETVALUE"],
    ["--hub_token", "hf_SECRETVALUE"], ["--api-key", "hf_SECRETVALUE"],
], ids=["token", "token=", "hub-token", "hub_token", "api-key"])
def test_push_refuses_a_token_option_without_echoing_it(tmp_path: Path, capsys, argv: list[str]) -> None:
    from hf_optbench import cli

    rc = cli.main(["push", str(tmp_path), "--repo-id", "me/run", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "hf_SECRETVALUE" not in err and "HF_TOKEN" in err and argv[0].split("=")[0] in err


def test_push_argparse_errors_never_echo_a_token(tmp_path: Path, capsys) -> None:
    """argparse quotes unrecognised arguments: a token pasted as a stray argument is redacted."""
    from hf_optbench import cli

    rc = cli.main(["push", str(tmp_path), "--repo-id", "me/run", FAKE_TOKEN])
    err = capsys.readouterr().err
    assert rc == 2 and "unrecognized arguments: <redacted>" in err and FAKE_TOKEN not in err


def test_redact_names_argv_and_text() -> None:
    assert all(redact.is_secret_name(n) for n in ("HF_TOKEN", "--hub-token", "WANDB_API_KEY", "db.password"))
    assert not any(redact.is_secret_name(n) for n in ("max_train_tokens", "--repo-id", "monkey", "keep"))
    argv = ["--token", "v1", "--api_key=v2", "--repo-id", "me/x", "--secret"]
    assert redact.secret_option_values(argv) == ["v1", "v2"]
    assert redact.redact_text(f"a v1 b {FAKE_TOKEN}", ["v1"]) == "a <redacted> b <redacted>"


def test_dry_run_stages_and_uploads_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from huggingface_hub import HfApi

    def refuse(*a, **k):
        raise AssertionError("a dry run must not call the Hub")

    monkeypatch.setattr(HfApi, "upload_folder", refuse)
    monkeypatch.setattr(HfApi, "create_repo", refuse)
    run = fake_run(tmp_path)
    before = _tree(tmp_path)
    assert push.main([str(run), "--repo-id", "me/tiny-lion", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "nothing uploaded" in out and "model.safetensors" in out and "README.md" in out
    # issue 33: the dry run wrote hub_upload/ into the run directory; it stages in a temporary folder now
    assert _tree(tmp_path) == before and not (run / "hub_upload").exists()
    kept = tmp_path / "kept"
    assert push.main([str(run), "--repo-id", "me/tiny-lion", "--dry-run", "--stage-dir", str(kept)]) == 0
    assert (kept / "model.safetensors").is_file() and f"in {kept}" in capsys.readouterr().out


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


# -------------------------------------------------------------------------------------------- a real run


def _files_containing(root: Path, needle: str) -> list[str]:
    data = needle.encode()
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and data in p.read_bytes()]


@pytest.mark.slow
def test_real_run_writes_no_token_and_stages_a_loadable_model(tmp_path: Path) -> None:
    """With HF_TOKEN in the environment (how huggingface_hub finds it), no file of the run directory (pickles
    included) may contain the token, and the staged folder loads with from_pretrained."""
    out = tmp_path / "run"
    env = dict(os.environ, HF_TOKEN=FAKE_TOKEN, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "hf_optbench.run", "recipes/quickstart_cpu.yaml", "--output_dir", str(out),
           "--max_steps", "3", "--eval_steps", "3", "--block_size", "64", "--per_device_train_batch_size", "4",
           "--per_device_eval_batch_size", "2",
           "--save_strategy", "steps", "--save_steps", "3", "--hub_model_id", "me/tiny-adamw"]
    proc = run_python(cmd, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert FAKE_TOKEN not in proc.stdout + proc.stderr
    assert _files_containing(out, FAKE_TOKEN) == []

    staged = stage.stage_upload_folder(out, repo_id="me/tiny-adamw", token=FAKE_TOKEN)
    assert _files_containing(staged, FAKE_TOKEN) == []
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(staged)
    tok = AutoTokenizer.from_pretrained(staged)
    summary = json.loads((out / "summary.json").read_text())
    assert sum(p.numel() for p in model.parameters()) == summary["num_params"]
    assert len(tok("สวัสดี")["input_ids"]) > 0


@pytest.mark.slow
def test_hub_token_on_the_command_line_is_refused_or_never_written(tmp_path: Path) -> None:
    """--hub_token is TrainingArguments' field: either the CLI refuses it, or the token reaches no file
    (TrainingArguments is pickled into training_args.bin in every checkpoint)."""
    out = tmp_path / "run"
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env.pop("HF_TOKEN", None)
    cmd = [sys.executable, "-m", "hf_optbench.run", "recipes/quickstart_cpu.yaml", "--output_dir", str(out),
           "--max_steps", "2", "--eval_steps", "2", "--block_size", "64", "--per_device_train_batch_size", "4",
           "--per_device_eval_batch_size", "2",
           "--save_strategy", "steps", "--save_steps", "2", "--hub_token", FAKE_TOKEN]
    proc = run_python(cmd, cwd=ROOT, env=env)
    assert FAKE_TOKEN not in proc.stdout + proc.stderr
    if proc.returncode == 2:
        assert "hub_token" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _files_containing(out, FAKE_TOKEN) == []
