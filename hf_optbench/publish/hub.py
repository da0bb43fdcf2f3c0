"""Share a run on the Hugging Face Hub: the upload itself through ``huggingface_hub``, of the checked folder
:mod:`hf_optbench.publish.stage` assembles; ``hf-optbench push`` is :mod:`hf_optbench.cli.push`.

    hf-optbench push runs/lion_gpt2_s0 --repo_id me/gpt2-lion-bench --dry_run   # stage + check, no network
    hf-optbench push runs/lion_gpt2_s0 --repo_id me/gpt2-lion-bench             # upload (private by default)
    hf-optbench run RECIPE.yaml --push_to_hub true --hub_model_id me/name       # upload at the end of the run

What is uploaded, and the checks it passes first, is the staged folder of :mod:`hf_optbench.publish.stage`.

``--push_to_hub true`` in a run: only hf_optbench talks to the Hub. The Trainer gets its arguments with
``push_to_hub`` off (:func:`trainer_arguments`), since the stock Trainer would create the repo at init and upload
``output_dir`` (pickles included) at every save. :func:`check_push_possible` refuses, before any work, a push that
cannot happen (offline, no token, a hub_strategy that uploads pickled checkpoints). ``hub_strategy`` ``end``
uploads once, after the run; ``every_save`` also uploads each checkpoint's staged set while training continues
(:func:`hub_callbacks`), skipping one while the previous upload runs unless ``hub_always_push``.

The token comes from ``HF_TOKEN`` or ``hf auth login`` (``huggingface_hub.get_token()``), never the command line.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.publish.card import build_model_card, progress_summary
from hf_optbench.publish.redact import redact_text
from hf_optbench.publish.stage import STAGE_MARKER, assemble, finish_stage, known_token, staged_upload
from hf_optbench.rundir import read_summary

logger = logging.getLogger(__name__)

STEP_STAGE_DIRNAME = "hub_upload_steps"  # one folder per checkpoint upload in flight (hub_strategy every_save)
# transformers' hub_strategy values that upload the resumable checkpoint (optimizer.pt, rng_state.pth,
# training_args.bin: pickles) to the repo; hf_optbench uploads safetensors only, so they are refused.
PICKLING_STRATEGIES = ("checkpoint", "all_checkpoints")


# ------------------------------------------------------------------------------------------ push_to_hub


@dataclass(frozen=True)
class HubTarget:
    """Where and when a run's ``--push_to_hub true`` uploads (never the token: it is read when uploading)."""

    repo_id: str  # may lack the owner: the token's user is then the owner, as with the Trainer
    private: bool
    every_save: bool  # hub_strategy every_save: each checkpoint as well as the end
    revision: str | None = None
    always_push: bool = False


def _hub_offline() -> bool:
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE", "")
    return bool(constants.HF_HUB_OFFLINE) or flag.strip().upper() in ("1", "ON", "YES", "TRUE")


def _validate_repo_id(repo_id: str, key: str) -> None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise OptBenchError(f"invalid {key} '{repo_id}': {exc} Use 'user-or-org/model-name'.") from None


def check_repo_id(repo_id: str, *, owner_from_token: bool = False) -> None:
    """``push``'s --repo_id is a Hub repo id with an owner (without one only where the token names the owner: the
    run's push_to_hub); checked for the dry run as for the upload, so a dry run never passes what the push refuses."""
    _validate_repo_id(repo_id, "--repo_id")
    if "/" not in repo_id and not owner_from_token:
        raise OptBenchError(f"--repo_id '{repo_id}' names no owner: use 'user-or-org/{repo_id}'.")


def _require_token(what: str) -> str:
    from huggingface_hub import get_token

    try:
        token = get_token()
    except Exception as exc:  # an OIDC exchange (HF_OIDC_RESOURCE) that failed raises its own types
        raise OptBenchError(f"could not obtain a Hugging Face token ({type(exc).__name__}): {what}") from None
    if not token:
        raise OptBenchError(f"no Hugging Face token: set HF_TOKEN in the environment or run `hf auth login` (tokens "
                            f"are never taken on the command line or in a recipe). {what}")
    return token


PUSH_LATER = "Or set push_to_hub false and upload later with `hf-optbench push RUN_DIR --repo_id ID`."


def check_hub_online() -> None:
    """OptBenchError when HF_HUB_OFFLINE is set: a push_to_hub run could upload nothing. Needs no parsed
    arguments, so a run asks it before transformers is imported (run.preflight)."""
    if _hub_offline():
        raise OptBenchError(f"push_to_hub is set but HF_HUB_OFFLINE is on, so nothing could be uploaded: unset "
                            f"HF_HUB_OFFLINE. {PUSH_LATER}")


def check_push_possible(args: Any, output_dir: str | os.PathLike[str] | None = None) -> HubTarget | None:
    """None without ``args.push_to_hub``; else the :class:`HubTarget`, or an OptBenchError (exit 2) when the push
    cannot happen: HF_HUB_OFFLINE set, no token, a hub_strategy that uploads pickled checkpoints, a bad
    hub_model_id. No network: every rank may call it, before any data or model work."""
    if not getattr(args, "push_to_hub", False):
        return None
    strategy = str(getattr(args.hub_strategy, "value", args.hub_strategy) or "every_save")
    if strategy in PICKLING_STRATEGIES:
        raise OptBenchError(
            f"hub_strategy '{strategy}' uploads the resumable checkpoint (optimizer.pt, rng_state.pth, "
            "training_args.bin: pickles), which hf_optbench never uploads. Use hub_strategy every_save (the "
            "safetensors weights at each checkpoint) or end (once, after the run)."
        )
    repo_id = args.hub_model_id or Path(output_dir if output_dir is not None else args.output_dir).name
    _validate_repo_id(repo_id, "hub_model_id" if args.hub_model_id else "hub_model_id (default: output_dir's name)")
    check_hub_online()
    _require_token(PUSH_LATER)
    return HubTarget(repo_id, private=getattr(args, "hub_private_repo", True) is not False,
                     every_save=strategy == "every_save", revision=getattr(args, "hub_revision", None),
                     always_push=bool(getattr(args, "hub_always_push", False)))


def trainer_arguments(args: Any) -> Any:
    """The TrainingArguments to hand the Trainer: ``args`` itself, or without push_to_hub a shallow copy with
    ``push_to_hub=False`` (the user's ``args``, and config.yaml, keep what was asked)."""
    if not getattr(args, "push_to_hub", False):
        return args
    import copy

    for_trainer = copy.copy(args)
    for_trainer.push_to_hub = False
    return for_trainer


def _hub_errors() -> tuple[type[BaseException], ...]:
    import httpx  # huggingface_hub 1.x+ talks HTTP through httpx

    return (OSError, ValueError, httpx.HTTPError)


def _upload(api: Any, target: HubTarget, folder: Path, message: str, run_dir: Path) -> Any:
    """create_repo (exist_ok), the branch when ``revision`` is set, and upload_folder; Hub errors become one line."""
    repo_id = target.repo_id
    try:
        if "/" not in repo_id:  # the Trainer's rule: a bare name goes to the token's user
            repo_id = f"{api.whoami()['name']}/{repo_id}"
        api.create_repo(repo_id, private=target.private, exist_ok=True, repo_type="model")
        if target.revision:
            api.create_branch(repo_id, branch=target.revision, exist_ok=True, repo_type="model")
        return api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=message,
                                 repo_type="model", revision=target.revision, ignore_patterns=[STAGE_MARKER])
    except _hub_errors() as exc:
        detail = redact_text(" ".join(str(exc).split()), [t for t in [known_token()] if t])
        raise OptBenchError(
            f"upload to the Hub repo '{repo_id}' failed ({type(exc).__name__}: {detail}). The run directory is "
            f"intact: retry with `hf-optbench push {run_dir} --repo_id {repo_id}`."
        ) from None


def push_run(run_dir: str | os.PathLike[str], repo_id: str, private: bool = True, token: str | None = None, *,
             commit_message: str | None = None, stage_dir: str | os.PathLike[str] | None = None,
             revision: str | None = None, owner_from_token: bool = False) -> str:
    """Stage, check and upload a finished run to ``repo_id`` (created private unless ``private=False``); returns
    the commit URL. The token is ``token`` or huggingface_hub's (``HF_TOKEN`` / login cache). A ``repo_id``
    without owner is refused unless ``owner_from_token`` (the run's push_to_hub, like the Trainer)."""
    from huggingface_hub import HfApi

    check_repo_id(repo_id, owner_from_token=owner_from_token)
    if _hub_offline():
        raise OptBenchError(
            "HF_HUB_OFFLINE is set, so nothing can be uploaded: unset it to push, or pass --dry_run to stage "
            "and check the upload folder only."
        )
    token = token or _require_token("Or pass --dry_run to stage and check only.")
    with staged_upload(run_dir, stage_dir, repo_id=repo_id, token=token) as staged:
        summary = read_summary(Path(run_dir), required=True)
        message = commit_message or (
            f"hf_optbench: {summary.get('optimizer', '?')} {summary.get('model_size', '?')}, "
            f"{summary.get('steps', '?')} steps")
        target = HubTarget(repo_id, private=private, every_save=False, revision=revision)
        info = _upload(HfApi(token=token), target, staged, message, Path(run_dir))
    return str(getattr(info, "commit_url", info))


# ------------------------------------------------------------------------------------- checkpoint uploads


class CheckpointUploads:
    """hub_strategy every_save: each checkpoint's staged set, uploaded in the background (huggingface_hub's
    ``run_as_future``: one worker thread, in order) so that training does not wait on the network.

    :meth:`submit` (at each save, main process) only links files, since the Trainer may rotate the checkpoint
    away at its next save; the card, the checks and the upload run in the worker. :meth:`wait` joins them."""

    def __init__(self, target: HubTarget, run_dir: str | os.PathLike[str]) -> None:
        self.target, self.run_dir = target, Path(run_dir)
        self.jobs: list[tuple[int, Any, Path]] = []  # (step, Future, staged folder)
        self.skipped: list[int] = []
        self._api: Any = None

    def submit(self, step: int, log_history: list[dict[str, Any]]) -> None:
        """Queue the upload of ``checkpoint-<step>``; skipped while the previous one runs, unless always_push."""
        from huggingface_hub import HfApi

        checkpoint = self.run_dir / f"checkpoint-{step}"
        if self.jobs and not self.jobs[-1][1].done() and not self.target.always_push:
            logger.info("hub: checkpoint-%d not uploaded, the previous upload is still running "
                        "(hub_always_push false)", step)
            self.skipped.append(step)
            return
        dest = self.run_dir / STEP_STAGE_DIRNAME / f"step-{step}"
        try:
            assemble(self.run_dir, dest, checkpoint, with_summary=False)
        except (OptBenchError, OSError) as exc:  # the run goes on: the final upload will report what is wrong
            logger.error("hub: checkpoint-%d not uploaded: %s", step, exc)
            return
        summary = progress_summary(self.run_dir, step, log_history)
        self._api = self._api or HfApi()
        future = self._api.run_as_future(self._stage_and_upload, dest, summary, step)
        self.jobs.append((step, future, dest))

    def _stage_and_upload(self, dest: Path, summary: dict[str, Any], step: int) -> Any:
        finish_stage(dest, build_model_card(self.run_dir, self.target.repo_id, summary=summary), None)
        return _upload(self._api, self.target, dest, f"hf_optbench: checkpoint at step {step}", self.run_dir)

    def wait(self) -> list[int]:
        """Join every upload and remove its staged folder; returns the steps uploaded (a failure is logged: the
        final upload follows and reports its own)."""
        uploaded = []
        for step, future, dest in self.jobs:
            try:
                future.result()
                uploaded.append(step)
            except Exception as exc:  # noqa: BLE001 - a worker's failure of any kind must not end the run
                logger.warning("hub: upload of checkpoint-%d failed: %s", step, exc)
            shutil.rmtree(dest, ignore_errors=True)
        self.jobs.clear()
        parent = self.run_dir / STEP_STAGE_DIRNAME
        if parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
        return uploaded


def hub_callbacks(target: HubTarget | None, output_dir: str | os.PathLike[str]) -> list[Any]:
    """The TrainerCallbacks of ``push_to_hub`` with hub_strategy every_save (a checkpoint upload at each save,
    joined at train end); [] otherwise. ``target``: :func:`check_push_possible`'s answer, asked once per run. The
    upload at the end of the run is :func:`push_run` (after summary.json)."""
    if target is None or not target.every_save:
        return []
    from transformers import TrainerCallback

    class HubCheckpointUpload(TrainerCallback):
        def __init__(self, uploads: CheckpointUploads) -> None:
            self.uploads = uploads

        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                self.uploads.submit(state.global_step, state.log_history)

        def on_train_end(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                self.uploads.wait()

    return [HubCheckpointUpload(CheckpointUploads(target, output_dir))]
