"""The Python API's Trainer hook (issue 33 item 7): schedule-free AdamW through ``trainer_optimizer`` no longer
trains without its train/eval switch in silence. The pair cannot install Trainer callbacks (the Trainer builds the
optimizer inside ``train()``), so it warns naming ``optimizer_callbacks``, which now takes the registry name."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from transformers import Trainer, TrainingArguments, default_data_collator

from hf_optbench.optim.registry import optimizer_callbacks
from hf_optbench.optim.schedule_free_impl import ScheduleFreeModeCallback
from hf_optbench.optim.unwrap import innermost_optimizer
from hf_optbench.run.trainer import schedule_training_args, trainer_optimizer

from fixtures.models import tiny_model, token_data

SF = "schedule_free_adamw"


def test_a_name_that_needs_callbacks_warns_naming_optimizer_callbacks() -> None:
    pytest.importorskip("schedulefree")
    with pytest.warns(UserWarning, match=r"optimizer_callbacks\('schedule_free_adamw'\)") as caught:
        trainer_optimizer(SF, model_size="tiny")
    assert "ScheduleFreeModeCallback" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer_optimizer("adamw", model_size="tiny")  # needs none: silent


def test_optimizer_callbacks_takes_a_registry_name() -> None:
    assert [type(c) for c in optimizer_callbacks(SF)] == [ScheduleFreeModeCallback]
    assert [type(c) for c in optimizer_callbacks("sf_adamw")] == [ScheduleFreeModeCallback]  # an alias
    assert optimizer_callbacks("adamw") == [] and optimizer_callbacks("torch.optim.RAdam") == []


@pytest.mark.parametrize("with_callbacks", [True, False])
def test_the_final_weights_are_the_average_only_with_the_callbacks(tmp_path: Path, with_callbacks: bool) -> None:
    """What the warning is for: without the switch the Trainer ends in train mode, so the saved model holds the
    training iterate y, not the averaged weights x."""
    pytest.importorskip("schedulefree")
    steps = 3
    args = TrainingArguments(str(tmp_path), max_steps=steps, per_device_train_batch_size=4, use_cpu=True,
                             report_to="none", save_strategy="no", disable_tqdm=True, seed=0,
                             **schedule_training_args("none", num_training_steps=steps))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        pair = trainer_optimizer(SF, model_size="tiny")
    trainer = Trainer(model=tiny_model(), args=args, train_dataset=token_data(4 * steps),
                      data_collator=default_data_collator, optimizer_cls_and_kwargs=pair,
                      callbacks=optimizer_callbacks(SF) if with_callbacks else None)
    trainer.train()
    assert innermost_optimizer(trainer.optimizer).param_groups[0]["train_mode"] is (not with_callbacks)


# ------------------------------------------------------------------ a Trainer user's files after training (issue 39)


class LocalHub:
    """``huggingface_hub.HfApi`` reduced to what ``Trainer.push_to_hub`` calls, writing each upload into a local
    folder (``root/<repo>``) after the ignore patterns, as huggingface_hub filters them: what would be sent."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import shutil
        from types import SimpleNamespace

        from huggingface_hub import HfApi, constants
        from huggingface_hub.utils import filter_repo_objects

        hub = self

        def create_repo(api, repo_id, **kw):
            return SimpleNamespace(repo_id=repo_id)

        def upload_folder(api, *, repo_id, folder_path, **kw):
            src = Path(folder_path)
            names = [str(p.relative_to(src)) for p in src.rglob("*") if p.is_file()]
            for name in filter_repo_objects(names, allow_patterns=kw.get("allow_patterns"),
                                            ignore_patterns=kw.get("ignore_patterns")):
                (hub.root / repo_id / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src / name, hub.root / repo_id / name)
            return SimpleNamespace(commit_url=f"file://{hub.root / repo_id}")

        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(HfApi, "create_repo", create_repo)
        monkeypatch.setattr(HfApi, "upload_folder", upload_folder)


@pytest.fixture(scope="module")
def lion_api_run(tmp_path_factory) -> dict:
    """The README's Python API path with Lion (its cited 3.33e-4 and 0.3) and the GPT-3 cosine with a 1-step
    warmup: a stock Trainer, trainer_optimizer, attach_callbacks; a checkpoint at the last step."""
    from transformers import Trainer, TrainingArguments, default_data_collator

    from hf_optbench.config.bench_args import BenchArguments
    from hf_optbench.measure.recorder import attach_callbacks, default_callbacks

    out = tmp_path_factory.mktemp("api") / "lion_api"
    args = TrainingArguments(str(out), max_steps=4, per_device_train_batch_size=4, use_cpu=True, logging_steps=1,
                             logging_nan_inf_filter=False, save_strategy="steps", save_steps=4, report_to="none",
                             eval_strategy="steps", eval_steps=2, disable_tqdm=True, hub_model_id="me/lion-api",
                             **schedule_training_args("gpt3_cosine", num_training_steps=4, warmup_steps=1))
    trainer = Trainer(model=tiny_model(), args=args, train_dataset=token_data(16), eval_dataset=token_data(8, seed=1),
                      data_collator=default_data_collator,
                      optimizer_cls_and_kwargs=trainer_optimizer("lion", model_size="tiny"))
    recorder, = default_callbacks(BenchArguments(), str(out), tokens_per_step=4 * 32)
    attach_callbacks(trainer, [recorder])
    trainer.train()
    return {"trainer": trainer, "args": args, "out": out}


LION_CARD = ("- learning_rate: 0.000333", "- optimizer: Use hf_optbench:lion and the args are:",
             "weight_decay=0.3", "betas=0.9/0.99", "- lr_scheduler_type: cosine_with_min_lr",
             "- lr_scheduler_warmup_steps: 1", "- training_steps: 4")


def _check_lion_args(saved) -> None:
    assert (saved.optim, saved.learning_rate, saved.weight_decay) == ("hf_optbench:lion", 3.33e-4, 0.3)
    assert (saved.adam_beta1, saved.adam_beta2, saved.warmup_steps) == (0.9, 0.99, 1)
    assert str(saved.lr_scheduler_type.value) == "cosine_with_min_lr"


def test_create_model_card_after_training_names_what_ran(lion_api_run: dict) -> None:
    trainer, out = lion_api_run["trainer"], lion_api_run["out"]
    trainer.create_model_card()
    card = (out / "README.md").read_text(encoding="utf-8")
    for line in LION_CARD:
        assert line in card, (line, card)
    assert "5e-05" not in card and "ADAMW" not in card.upper().replace("HF_OPTBENCH", "")


def test_training_args_bin_final_and_checkpoint_agree_on_what_ran(lion_api_run: dict) -> None:
    import torch

    trainer, out = lion_api_run["trainer"], lion_api_run["out"]
    trainer.save_model()
    final = torch.load(out / "training_args.bin", weights_only=False)
    checkpoint = torch.load(out / "checkpoint-4" / "training_args.bin", weights_only=False)
    for saved in (final, checkpoint):
        _check_lion_args(saved)
    assert final.optim_args == checkpoint.optim_args and final.optim_args.startswith("implementation=lion_pytorch")


def test_push_to_hub_sends_files_that_name_what_ran(lion_api_run: dict, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    LocalHub(tmp_path / "hub").install(monkeypatch)
    lion_api_run["trainer"].push_to_hub()
    sent = tmp_path / "hub" / "me" / "lion-api"
    card = (sent / "README.md").read_text(encoding="utf-8")
    assert all(line in card for line in LION_CARD), card
    _check_lion_args(torch.load(sent / "training_args.bin", weights_only=False))
    assert (sent / "model.safetensors").is_file() and not list(sent.glob("checkpoint-*"))


def test_the_callers_arguments_stay_as_they_were(lion_api_run: dict) -> None:
    """attach_callbacks gave the Trainer its own copy: the caller's object, from which nothing is written, still
    names what transformers would build from it."""
    from transformers.training_args import OptimizerNames

    args = lion_api_run["args"]
    assert args.optim == OptimizerNames.ADAMW_TORCH_FUSED and args.learning_rate == 5e-05
    assert lion_api_run["trainer"].args is not args


def test_an_api_runs_summary_has_the_fields_a_run_writes(lion_api_run: dict) -> None:
    import json

    from hf_optbench.measure.provenance import SUMMARY_KEYS

    summary = json.loads((lion_api_run["out"] / "summary.json").read_text())
    assert [k for k in SUMMARY_KEYS if k not in summary] == []
    assert summary["model_size"] == "custom (n_layer 2, n_head 2, n_embd 32)"
    assert (summary["steps"], summary["max_steps"], summary["tokens_seen"], summary["block_size"]) == (4, 4, 512, 32)
    eval_losses = [row["eval_loss"] for row in lion_api_run["trainer"].state.log_history if "eval_loss" in row]
    assert summary["final_eval_loss"] == eval_losses[-1] and summary["final_train_loss"] is not None
    assert summary["schedule_resolved"]["warmup_steps"] == 1 and summary["launch"]["processes"] == 1
    assert summary["env"]["packages"]["transformers"] and summary["status"] == "completed"


def test_arguments_written_from_the_objects_fail_a_reuse_by_name(tmp_path: Path) -> None:
    """A recorder passed as Trainer(callbacks=[...]) writes what runs into the caller's own arguments (no copy is
    possible there): a Trainer that reuses them to build its own optimizer stops naming it, not on optim_args."""
    from transformers import Trainer, TrainingArguments

    from hf_optbench.config.bench_args import BenchArguments
    from hf_optbench.measure.recorder import OptBenchRecorder
    from hf_optbench.optim.registry import build_optimizer
    from hf_optbench.optim.schedules import build_scheduler

    model = tiny_model()
    opt = build_optimizer("lion", model, model_size="tiny")
    args = TrainingArguments(str(tmp_path), max_steps=4, use_cpu=True, report_to="none")
    Trainer(model=model, args=args, train_dataset=token_data(4), data_collator=default_data_collator,
            optimizers=(opt, build_scheduler("cosine", opt, num_training_steps=4, warmup_steps=1)),
            callbacks=[OptBenchRecorder(tmp_path, BenchArguments())])
    assert (args.optim, args.lr_scheduler_type.value, args.warmup_steps) == ("hf_optbench:lion", "cosine", 1)
    with pytest.raises(ValueError, match="unsupported optimizer: hf_optbench:lion"):
        Trainer(model=tiny_model(), args=args, train_dataset=token_data(4)).create_optimizer()
