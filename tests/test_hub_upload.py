"""`--push_to_hub true` (issue 13 item 2): only hf_optbench talks to the Hub, and it uploads the staged set only.

The Hub client is replaced by a recording fake (``huggingface_hub.HfApi``'s methods, which both hf_optbench and
the Trainer's ``hf_api()`` call), so every repo creation and every uploaded file, whoever sent it, is seen. The
exact uploaded file lists are asserted for hub_strategy ``end`` (once, after the run) and ``every_save`` (each
checkpoint, then the end), with a real Trainer saving real checkpoints next to their pickles; every uploaded file
must parse as safetensors, JSON, JSON lines or UTF-8 text (a pickle parses as none of them). Offline or without a
token, the push is refused before any work; the run-level test checks the same through ``run.main``.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from hf_optbench.errors import OptBenchError
from hf_optbench.publish import hub

from fixtures.hub_run import fake_run

ROOT = Path(__file__).resolve().parents[1]
FAKE_TOKEN = "hf_" + "Zq7" * 12  # token-shaped, never valid
REPO = "me/tiny-adamw"
MODEL_FILES = ["README.md", "config.json", "generation_config.json", "metrics.jsonl", "model.safetensors",
               "tokenizer.json", "tokenizer_config.json"]
END_FILES = sorted(MODEL_FILES + ["summary.json"])  # a Trainer run of the Python API
RUN_END_FILES = sorted(END_FILES + ["config.yaml"])  # a run of hf_optbench.run: config.yaml reruns it (the card says so)


# ------------------------------------------------------------------------------------ the recording Hub


def _parse_as_shareable(path: Path) -> str:
    """How the file parses: 'safetensors', 'json', 'jsonl' or 'text'. Raises for anything else (a pickle, a
    torch.save zip), independently of hf_optbench's own checks."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            f.keys()
        return "safetensors"
    text = path.read_bytes().decode("utf-8")  # 0x80 (pickle PROTO) and zip headers are not UTF-8 text
    if path.suffix == ".json":
        json.loads(text)
        return "json"
    if path.suffix == ".jsonl":
        [json.loads(line) for line in text.splitlines() if line.strip()]
        return "jsonl"
    return "text"


class RecordingHub:
    """Every HfApi call that would reach the Hub, with the files each upload_folder would send (after its
    ignore_patterns, as huggingface_hub filters them), checked by content as they are sent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.repos: list[tuple[str, object]] = []
        self.uploads: list[dict] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from huggingface_hub import HfApi
        from huggingface_hub.utils import filter_repo_objects

        rec = self

        def whoami(api, *a, **kw):
            return {"name": "me"}

        def create_repo(api, repo_id, **kw):
            with rec.lock:
                rec.repos.append((repo_id, kw.get("private")))
            return SimpleNamespace(repo_id=repo_id if "/" in repo_id else f"me/{repo_id}")

        def create_branch(api, repo_id, **kw):
            return None

        def upload_folder(api, *, repo_id, folder_path, **kw):
            root = Path(folder_path)
            names = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]
            names = sorted(filter_repo_objects(names, allow_patterns=kw.get("allow_patterns"),
                                               ignore_patterns=kw.get("ignore_patterns")))
            kinds = {n: _parse_as_shareable(root / n) for n in names}
            texts = "".join((root / n).read_bytes().decode("latin-1") for n in names)
            with rec.lock:
                rec.uploads.append({"repo_id": repo_id, "files": names, "kinds": kinds,
                                    "message": kw.get("commit_message"), "revision": kw.get("revision"),
                                    "token_inside": FAKE_TOKEN in texts})
            return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/{len(rec.uploads)}")

        for name, fn in (("whoami", whoami), ("create_repo", create_repo), ("create_branch", create_branch),
                         ("upload_folder", upload_folder)):
            monkeypatch.setattr(HfApi, name, fn)


@pytest.fixture
def online_hub(monkeypatch: pytest.MonkeyPatch) -> RecordingHub:
    """The suite's HF_HUB_OFFLINE lifted, a token in HF_TOKEN, and the Hub replaced by the recorder."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    rec = RecordingHub()
    rec.install(monkeypatch)
    return rec


def _args(tmp_path: Path, **kw) -> SimpleNamespace:
    base = dict(push_to_hub=True, hub_model_id=REPO, hub_strategy="end", hub_private_repo=True, hub_revision=None,
                hub_always_push=False, output_dir=str(tmp_path / "run"))
    return SimpleNamespace(**{**base, **kw})


# ------------------------------------------------------------------------------------- check_push_possible


def test_check_push_possible_without_push_is_none(tmp_path: Path) -> None:
    assert hub.check_push_possible(_args(tmp_path, push_to_hub=False)) is None


def test_check_push_possible_refuses_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    with pytest.raises(OptBenchError, match="push_to_hub is set but HF_HUB_OFFLINE is on.*push_to_hub false"):
        hub.check_push_possible(_args(tmp_path))


def test_check_push_possible_refuses_no_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, online_hub) -> None:
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(OptBenchError, match="no Hugging Face token: set HF_TOKEN.*hf auth login"):
        hub.check_push_possible(_args(tmp_path))


@pytest.mark.parametrize("strategy", ["checkpoint", "all_checkpoints"])
def test_check_push_possible_refuses_strategies_that_upload_pickles(tmp_path: Path, online_hub,
                                                                     strategy: str) -> None:
    with pytest.raises(OptBenchError, match=f"hub_strategy '{strategy}'.*pickles.*every_save.*end"):
        hub.check_push_possible(_args(tmp_path, hub_strategy=strategy))


def test_check_push_possible_refuses_a_bad_repo_id(tmp_path: Path, online_hub) -> None:
    with pytest.raises(OptBenchError, match="invalid hub_model_id 'me/bad name'"):
        hub.check_push_possible(_args(tmp_path, hub_model_id="me/bad name"))


def test_check_push_possible_target(tmp_path: Path, online_hub) -> None:
    target = hub.check_push_possible(_args(tmp_path, hub_model_id=None, hub_strategy="every_save",
                                           hub_private_repo=None, hub_revision="bench", hub_always_push=True))
    assert target == hub.HubTarget("run", private=True, every_save=True, revision="bench", always_push=True)
    assert FAKE_TOKEN not in repr(target)
    assert hub.check_push_possible(_args(tmp_path, hub_private_repo=False)).private is False
    assert online_hub.repos == [] and online_hub.uploads == []  # a check, not an upload


def test_trainer_arguments_turn_push_off_on_a_copy(tmp_path: Path) -> None:
    from transformers import TrainingArguments

    args = TrainingArguments(str(tmp_path / "run"), push_to_hub=True, hub_model_id=REPO, report_to="none",
                             use_cpu=True)
    for_trainer = hub.trainer_arguments(args)
    assert for_trainer.push_to_hub is False and args.push_to_hub is True
    assert for_trainer.hub_model_id == REPO and for_trainer.output_dir == args.output_dir
    plain = TrainingArguments(str(tmp_path / "run"), report_to="none", use_cpu=True)
    assert hub.trainer_arguments(plain) is plain


def test_a_checkpoint_upload_is_skipped_while_the_previous_runs(tmp_path: Path, online_hub,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """hub_always_push false (transformers' default): a save while an upload is in flight uploads nothing."""

    run = fake_run(tmp_path, steps=(2, 4))
    release = threading.Event()
    uploads = hub.CheckpointUploads(hub.HubTarget(REPO, private=True, every_save=True), run)
    monkeypatch.setattr(hub.CheckpointUploads, "_stage_and_upload", lambda self, *a: release.wait(30))
    uploads.submit(2, [])
    uploads.submit(4, [])  # the first upload is blocked: skipped
    release.set()
    assert uploads.wait() == [2] and uploads.skipped == [4]
    assert not (run / hub.STEP_STAGE_DIRNAME).exists()


def test_a_bare_repo_name_goes_to_the_token_owner(tmp_path: Path, online_hub) -> None:
    """The Trainer's rule for hub_model_id without owner (whoami's name), kept by the run's push."""

    hub.push_run(fake_run(tmp_path), "tiny-lion", owner_from_token=True)
    assert online_hub.repos == [("me/tiny-lion", True)] and online_hub.uploads[0]["repo_id"] == "me/tiny-lion"


def test_a_failed_upload_is_one_line_without_the_token(tmp_path: Path, online_hub,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import HfApi

    def refuse(api, *a, **kw):
        raise OSError(f"403 Forbidden for token {FAKE_TOKEN}\nrequest id: 1")

    monkeypatch.setattr(HfApi, "create_repo", refuse)
    run = fake_run(tmp_path)
    with pytest.raises(OptBenchError) as err:
        hub.push_run(run, REPO)
    message = str(err.value)
    assert "\n" not in message and FAKE_TOKEN not in message and "403 Forbidden" in message
    assert f"retry with `hf-optbench push {run} --repo_id {REPO}`" in message
    assert (run / "summary.json").is_file() and (run / "checkpoint-10" / "model.safetensors").is_file()


# ------------------------------------------------------------------------------- a real Trainer, both modes


def _tiny_trainer_run(out: Path, args) -> None:
    """What run.train does with a push_to_hub run, minus data preparation: check, Trainer on trainer_arguments with
    the recorder and hub_callbacks, train (checkpoints at steps 2 and 4), summary.json, then run._publish."""
    import datasets
    import torch
    from transformers import Trainer, default_data_collator

    from hf_optbench.config.bench_args import BenchArguments
    from hf_optbench.data.tokenizers import load_tokenizer
    from hf_optbench.measure.recorder import default_callbacks
    from hf_optbench.models import build_model
    from hf_optbench.run import train as run_mod

    hub.check_push_possible(args, out)
    tok = load_tokenizer("builtin:thai-bpe-2k")
    torch.manual_seed(0)
    model = build_model("tiny", len(tok), n_positions=32)
    ids = torch.randint(0, len(tok), (16, 32)).tolist()
    train = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})
    callbacks = default_callbacks(BenchArguments(), str(out), tokens_per_step=64) + hub.hub_callbacks(hub.check_push_possible(args, out), out)
    trainer = Trainer(model=model, args=hub.trainer_arguments(args), train_dataset=train, processing_class=tok,
                      data_collator=default_data_collator, callbacks=callbacks)
    trainer.train()
    summary = json.loads((out / "summary.json").read_text())
    summary.update(optimizer="adamw", model_size="tiny", steps=trainer.state.global_step, status="completed")
    (out / "summary.json").write_text(json.dumps(summary))
    run_mod._publish(SimpleNamespace(training=args, run=SimpleNamespace(write_model_card=True)), out)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["end", "every_save"])
def test_push_to_hub_uploads_exactly_the_staged_set(tmp_path: Path, online_hub, strategy: str) -> None:
    from transformers import TrainingArguments

    out = tmp_path / "run"
    args = TrainingArguments(str(out), push_to_hub=True, hub_model_id=REPO, hub_strategy=strategy,
                             hub_always_push=True, max_steps=4, save_strategy="steps", save_steps=2,
                             per_device_train_batch_size=4, logging_steps=1, logging_nan_inf_filter=False,
                             report_to="none", use_cpu=True, disable_tqdm=True, learning_rate=1e-3)
    _tiny_trainer_run(out, args)

    uploads = online_hub.uploads
    expected = ([("hf_optbench: checkpoint at step 2", MODEL_FILES), ("hf_optbench: checkpoint at step 4", MODEL_FILES)]
                if strategy == "every_save" else [])
    expected.append(("hf_optbench: adamw tiny, 4 steps", END_FILES))
    assert [(u["message"], u["files"]) for u in uploads] == expected
    assert {u["repo_id"] for u in uploads} == {REPO} and not any(u["token_inside"] for u in uploads)
    assert online_hub.repos == [(REPO, True)] * len(expected)  # only ours: the Trainer created no repo
    for u in uploads:  # by content: weights are safetensors, everything else JSON or text
        assert u["kinds"]["model.safetensors"] == "safetensors" and set(u["kinds"].values()) <= {
            "safetensors", "json", "jsonl", "text"}
    assert sorted(p.name for p in out.glob("checkpoint-*/training_args.bin"))  # the pickles exist, unsent
    assert not (out / hub.STEP_STAGE_DIRNAME).exists()


# ----------------------------------------------------------------------------------------- through run.main



def _run_argv(out: Path, *extra: str) -> list[str]:
    return [str(ROOT / "recipes" / "quickstart_cpu.yaml"), "--output_dir", str(out), "--max_steps", "4",
            "--eval_steps", "4", "--block_size", "32", "--per_device_train_batch_size", "2",
            "--per_device_eval_batch_size", "2", "--save_strategy", "steps", "--save_steps", "2",
            "--push_to_hub", "true", "--hub_model_id", REPO, *extra]


def test_run_push_offline_stops_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from hf_optbench.run import train as run_mod

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(run_mod, "prepare", lambda *a, **k: pytest.fail("data/model work started"))
    assert run_mod.main(_run_argv(tmp_path / "run")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "HF_HUB_OFFLINE" in err[0] and "Traceback" not in err[0]


@pytest.mark.slow
def test_run_push_every_save_uploads_only_the_staged_set(tmp_path: Path, online_hub, monkeypatch) -> None:
    from hf_optbench.run import train as run_mod

    monkeypatch.setenv("HF_OPTBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    assert run_mod.main(_run_argv(out, "--hub_strategy", "every_save", "--hub_always_push", "true")) == 0
    steps = [u["message"] for u in online_hub.uploads]
    assert steps == ["hf_optbench: checkpoint at step 2", "hf_optbench: checkpoint at step 4",
                     "hf_optbench: adamw tiny, 4 steps"]
    assert all(not any(f.endswith((".bin", ".pt", ".pth", ".pkl")) for f in u["files"]) for u in online_hub.uploads)
    assert online_hub.uploads[-1]["files"] == RUN_END_FILES
    assert {r for r, _ in online_hub.repos} == {REPO}
