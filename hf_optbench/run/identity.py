"""The identity lives with the state: every checkpoint carries the plan it was trained with, and a resume loads a
checkpoint only when that plan matches the one now asked for.

Why in the checkpoint: a resume restores the checkpoint's weights, optimizer and scheduler state and continues
them. An identity kept beside the checkpoints (a ``run_identity.json`` in the run directory) could be damaged,
deleted, or belong to another directory than the checkpoint named, and a resume with another learning rate,
optimizer or data then trained the old state under the new labels. :class:`PlanStamp` writes the plan's identity
and hash into each checkpoint's ``trainer_state.json``, the file transformers writes last (so a checkpoint is
complete and stamped at once), through transformers' own ``ExportableState`` mechanism. :func:`choose_checkpoint`
reads it back from the checkpoint it would load, whatever directory that is in, and refuses (exit 2) on a mismatch,
naming each key; a checkpoint without a stamp is refused too unless ``--resume_from_checkpoint force``, which the
records then state. A damaged checkpoint (a safetensors header zeroed, a truncated ``optimizer.pt``) is passed over
for the newest complete and readable one, in one line, never deleted.
"""

from __future__ import annotations

import json
import re
import sys
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from hf_optbench.errors import OptBenchError
from hf_optbench.rundir import STAMP_KEY, TORN_CHECKPOINTS_DIR, TRAINER_STATE_FILE

if TYPE_CHECKING:
    from hf_optbench.run.plan import RunPlan


class PlanStamp(TrainerCallback, ExportableState):
    """Writes ``stamp`` ({"plan_hash", "identity"}) into every checkpoint's trainer_state.json (``state()``, which
    transformers' ``_save_checkpoint`` calls after the weights, optimizer and scheduler are written and before
    trainer_state.json), and checks at train begin that the scheduler the Trainer built computes the plan's
    ``schedule`` (it builds it from TrainingArguments, also after DeepSpeed's re-initialisation)."""

    def __init__(self, stamp: Mapping[str, Any] | None = None, schedule: Mapping[str, Any] | None = None) -> None:
        self.stamp = {k: v for k, v in (stamp or {}).items() if k != "step"}
        self.schedule = dict(schedule or {})
        self.step: int | None = None

    def state(self) -> dict[str, Any]:
        # the step the checkpoint is written at, beside the plan: a resume checks trainer_state.json's global_step
        # against it (check_step_records)
        return {"args": {"stamp": {**self.stamp, "step": self.step}}, "attributes": {}}

    def on_step_end(self, args, state, control, **kwargs):
        self.step = state.global_step  # transformers saves a checkpoint after on_step_end, at this step

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        self.step = state.global_step
        # A state resumed from a checkpoint written without a stamp (``force``) lacks our key, and transformers'
        # _save_checkpoint indexes it without a default (KeyError at the first save): give it one.
        state.stateful_callbacks.setdefault(STAMP_KEY, self.state())
        if self.schedule and lr_scheduler is not None:
            check_schedule(self.schedule, lr_scheduler)


def check_schedule(planned: Mapping[str, Any], scheduler: Any) -> None:
    """RuntimeError unless ``scheduler`` (read from the object) computes the planned schedule: its name (a
    schedule-free optimizer's "none" runs as transformers' constant) and every parameter both records hold."""
    from hf_optbench.optim.schedules import describe_scheduler

    held = describe_scheduler(scheduler)
    want = dict(planned)
    if want.get("name") == "none":
        want["name"] = "constant"
    if want.get("warmup_by") == "optimizer":
        want["warmup_steps"] = 0  # the optimizer warms up; its scheduler is constant
    diff = {k: (want[k], held[k]) for k in want.keys() & held.keys() if want[k] != held[k]}
    if diff:
        raise RuntimeError(f"the scheduler the Trainer built is not the planned one: {diff} (planned, built)")


# ---------------------------------------------------------------------------------------------------- reading
def read_trainer_state(ckpt: Path) -> dict[str, Any] | None:
    """A checkpoint's trainer_state.json, or None when it is missing or unreadable (the checkpoint is incomplete)."""
    return trainer_state_or_problem(ckpt)[0]


def trainer_state_or_problem(ckpt: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(a checkpoint's trainer_state.json, None), or (None, why) for one that is there but unreadable (damaged:
    said on the console when a resume passes it over), or (None, None) without one (a save cut short: torn)."""
    path = ckpt / TRAINER_STATE_FILE
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"{TRAINER_STATE_FILE}: {type(exc).__name__}: {str(exc)[:120]}"
    if not isinstance(data, dict):
        return None, f"{TRAINER_STATE_FILE}: not a JSON object"
    return data, None


def read_stamp(trainer_state: Mapping[str, Any]) -> dict[str, Any] | None:
    """The plan stamp a checkpoint's trainer_state.json holds, or None."""
    entry = (trainer_state.get("stateful_callbacks") or {}).get(STAMP_KEY)
    entry = entry[-1] if isinstance(entry, list) and entry else entry
    stamp = ((entry or {}).get("args") or {}).get("stamp") if isinstance(entry, dict) else None
    ok = isinstance(stamp, dict) and isinstance(stamp.get("identity"), dict) and isinstance(stamp.get("plan_hash"), str)
    return stamp if ok else None


def plan_stamp(plan: RunPlan) -> dict[str, Any]:
    return {"plan_hash": plan.plan_hash, "identity": dict(plan.identity)}


def checkpoint_problem(ckpt: Path) -> str | None:
    """Why a checkpoint with a trainer_state.json cannot be loaded, from its files' own formats (cheap: headers and
    the zip directory, never the tensors), or None: a safetensors file whose header does not parse or does not
    cover the file, a torch file (torch.save's zip: optimizer, scheduler, RNG, DeepSpeed's shards) without its zip
    directory (truncated), a JSON file that does not parse."""
    for path in sorted(p for p in ckpt.rglob("*") if p.is_file()):
        name = str(path.relative_to(ckpt))
        try:
            if path.suffix == ".safetensors":
                from safetensors import safe_open

                with safe_open(str(path), "pt"):
                    pass
            elif path.suffix in (".pt", ".pth", ".bin"):
                with zipfile.ZipFile(path):
                    pass
            elif path.suffix == ".json":
                json.loads(path.read_text(encoding="utf-8"))
        except Exception as exc:  # safetensors, zipfile and json each raise their own kinds on damaged bytes
            return f"{name}: {type(exc).__name__}: {str(exc)[:120]}"
    return None


def identity_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{key: (old, new)} for every key whose value differs, a key only one side holds included ("(absent)")."""
    absent = "(absent)"
    return {k: (old.get(k, absent), new.get(k, absent)) for k in sorted(old.keys() | new.keys())
            if old.get(k, absent) != new.get(k, absent)}


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


# ---------------------------------------------------------------------------------------------------- choosing
@dataclass(frozen=True)
class Resumption:
    """The checkpoint a resume loads: its ``step``, whether its identity was ``forced`` (none to verify), and the
    newer checkpoints passed over as damaged (``skipped``: "checkpoint-N: why")."""

    checkpoint: Path
    step: int
    forced: bool = False
    skipped: tuple[str, ...] = field(default=())

    def record(self) -> dict[str, Any]:
        """summary.json's ``resumed_from``."""
        return {"checkpoint": str(self.checkpoint), "step": self.step, "identity": "forced" if self.forced else
                "verified", "skipped_damaged": list(self.skipped)}


def _numbered(out: Path) -> list[Path]:
    """``checkpoint-N`` folders of ``out``, newest first."""
    found = [p for p in out.glob("checkpoint-*") if p.is_dir() and re.fullmatch(r"checkpoint-\d+", p.name)]
    return sorted(found, key=lambda p: -int(p.name.split("-")[1]))


def newest_loadable_checkpoint(out: Path) -> Path | None:
    """The checkpoint a ``--resume_from_checkpoint true`` would load from ``out`` as far as its files say: the newest
    complete (trainer_state.json readable) and readable (:func:`checkpoint_problem`) one; None when there is none.
    Its identity is checked by the resume itself."""
    for ckpt in _numbered(out):
        if read_trainer_state(ckpt) is not None and checkpoint_problem(ckpt) is None:
            return ckpt
    return None


def _verify(plan: RunPlan, ckpt: Path, state: Mapping[str, Any], where: str) -> bool:
    """True when forced; OptBenchError when the checkpoint's stamp is missing (without force) or differs."""
    stamp = read_stamp(state)
    if stamp is None:
        if plan.resume.force:
            return True
        raise OptBenchError(
            f"cannot resume '{where}': {ckpt.name} carries no verifiable identity (a checkpoint written before "
            "hf_optbench stamped its plan into checkpoints, or its trainer_state.json was edited), so nothing shows "
            "it was trained with these settings. Resume it anyway with --resume_from_checkpoint force (the records "
            "say so), or start over with --overwrite_output_dir true (without --resume_from_checkpoint)."
        )
    if stamp["plan_hash"] != plan.plan_hash:
        changes = identity_changes(stamp["identity"], plan.identity)
        listed = ", ".join(f"{k} {_show(a)} -> {_show(b)}" for k, (a, b) in changes.items()) or "the plan's hash"
        raise OptBenchError(
            f"cannot resume '{where}' with a changed configuration: {listed}. Its checkpoint {ckpt.name} was "
            "trained with the old values, so the resumed run would continue the old training under the new labels. "
            "Resume with the old values, use a new --output_dir, or --overwrite_output_dir true (without "
            "--resume_from_checkpoint) to start over."
        )
    return False


def _count(value: Any) -> int | None:
    """A step count held as an int, a float or a 0-d tensor (torch optimizers keep ``step`` as a tensor)."""
    try:
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return int(number) if number == number and abs(number) < 2**62 else None


def _torch_file(path: Path) -> Any:
    """A checkpoint's torch file (torch.save's zip) as torch's safe loader reads it, memory-mapped (the optimizer's
    moments are not read); None when it is absent or does not load (DeepSpeed keeps these elsewhere)."""
    if not path.is_file():
        return None
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - any unloadable file: its step is not known, the other records still are
        return None


def _scheduler_steps(ckpt: Path) -> int | None:
    """How many times the checkpoint's scheduler stepped (``last_epoch``: once per optimizer step)."""
    state = _torch_file(ckpt / "scheduler.pt")
    return _count(state.get("last_epoch")) if isinstance(state, dict) else None


def _optimizer_steps(ckpt: Path) -> int | None:
    """The largest step count the checkpoint's optimizer state holds (per tensor, as torch's AdamW keeps it, or per
    group, as Sophia's), or None where its optimizer keeps none (Lion)."""
    state = _torch_file(ckpt / "optimizer.pt")
    if not isinstance(state, dict):
        return None
    entries = [*(state.get("state") or {}).values(), *(state.get("param_groups") or [])]
    counts = [_count(e["step"]) for e in entries if isinstance(e, dict) and "step" in e]
    return max((c for c in counts if c is not None), default=None)


def step_record_problems(ckpt: Path, state: Mapping[str, Any], *, steps_may_be_skipped: bool = False) -> list[str]:
    """Where a checkpoint's own records disagree with its trainer_state.json's ``global_step``, the step the Trainer
    resumes at: its folder name (``checkpoint-N``, named by the Trainer at that step), the step the plan stamp was
    written at, its scheduler's step count (one step per optimizer step; fewer only where fp16's loss scaler skips
    steps: ``steps_may_be_skipped``) and its optimizer's (never more than the Trainer's). Why: an edited
    ``global_step`` (4 -> 1) was resumed "identity verified", retraining steps 2-4 on the step-4 weights and state."""
    step = state.get("global_step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return [f"its global_step is {step!r}, not a step count"]
    problems = []
    named = re.fullmatch(r"checkpoint-(\d+)", ckpt.name)
    if named and int(named.group(1)) != step:
        problems.append(f"its folder name says step {named.group(1)}")
    stamped = (read_stamp(state) or {}).get("step")
    if isinstance(stamped, int) and stamped != step:
        problems.append(f"its plan stamp was written at step {stamped}")
    scheduler = _scheduler_steps(ckpt)
    if scheduler is not None and (scheduler > step or (scheduler < step and not steps_may_be_skipped)):
        problems.append(f"its scheduler.pt has stepped {scheduler} times")
    optimizer = _optimizer_steps(ckpt)
    if optimizer is not None and optimizer > step:
        problems.append(f"its optimizer.pt holds step {optimizer}")
    return [f"{TRAINER_STATE_FILE} says global_step {step} but " + ", ".join(problems)] if problems else []


def _check_steps(plan: RunPlan, ckpt: Path, state: Mapping[str, Any], where: str, older: Path | None) -> None:
    """OptBenchError when the checkpoint's step records disagree (:func:`step_record_problems`)."""
    problems = step_record_problems(ckpt, state, steps_may_be_skipped=bool(plan.args.training.fp16))
    if problems:
        other = f" (--resume_from_checkpoint {older})" if older is not None else ""
        raise OptBenchError(
            f"cannot resume '{where}': {ckpt.name}'s records disagree on its step: {'; '.join(problems)}. Its "
            f"{TRAINER_STATE_FILE} was edited or belongs to another checkpoint, and the run would continue from the "
            f"wrong step. Restore that file, resume from another checkpoint{other}, or start over with "
            "--overwrite_output_dir true (without --resume_from_checkpoint)."
        )


def choose_checkpoint(plan: RunPlan, out: Path, *, move: bool = True) -> Resumption | None:
    """The checkpoint the run resumes from (None without ``resume_from_checkpoint``), its identity and its step
    (:func:`step_record_problems`) verified against ``plan`` before anything is moved, built or written. ``latest``:
    the newest checkpoint of ``out`` that is complete (trainer_state.json, written last) and readable
    (:func:`checkpoint_problem`); newer torn or damaged ones are passed over, one line each on stderr naming both
    checkpoints, and with ``move`` (the main process) moved to ``torn_checkpoints/``, never deleted. A named path
    must be complete and readable itself."""
    req = plan.resume
    if not req.requested:
        return None
    if req.mode == "path":
        return _named_checkpoint(plan, Path(req.path or ""))
    folders = _numbered(out)
    read = {p: trainer_state_or_problem(p) for p in folders}
    states = {p: state for p, (state, _) in read.items()}
    complete = [p for p in folders if states[p] is not None]
    if not complete:
        raise OptBenchError(
            f"--resume_from_checkpoint true but '{out}' holds no complete checkpoint-* folder: start without it "
            "(with --overwrite_output_dir true if the folder has other results), or pass a checkpoint path."
        )
    skipped: list[tuple[Path, str]] = [(p, why) for p, (_, why) in read.items() if why is not None]
    chosen = None
    for ckpt in complete:
        problem = checkpoint_problem(ckpt)
        if problem is None:
            chosen = ckpt
            break
        skipped.append((ckpt, problem))
    if chosen is None:
        listed = "; ".join(f"{p.name} ({why})" for p, why in skipped)
        raise OptBenchError(f"cannot resume '{out}': no checkpoint is readable: {listed}. Start over with "
                            "--overwrite_output_dir true (without --resume_from_checkpoint).")
    forced = _verify(plan, chosen, states[chosen], str(out))
    older = next((p for p in complete if _number(p) < _number(chosen)), None)
    _check_steps(plan, chosen, states[chosen], str(out), older)
    skipped.sort(key=lambda item: -_number(item[0]))
    if move:
        torn = [p for p in folders if states[p] is None and read[p][1] is None]
        _set_aside(out, torn, skipped, chosen)
    return Resumption(chosen, int(states[chosen].get("global_step") or 0), forced,
                      tuple(f"{p.name}: {why}" for p, why in skipped))


def _named_checkpoint(plan: RunPlan, ckpt: Path) -> Resumption:
    """``--resume_from_checkpoint PATH``: that checkpoint, complete, readable, its identity and step verified."""
    state, why = trainer_state_or_problem(ckpt) if ckpt.is_dir() else (None, None)
    if state is None:
        raise OptBenchError(f"--resume_from_checkpoint '{ckpt}' is not a complete checkpoint (no readable "
                            f"{TRAINER_STATE_FILE}{f': {why}' if why else ''}). Pass a checkpoint-N folder, or true "
                            "for the newest in output_dir.")
    problem = checkpoint_problem(ckpt)
    if problem:
        raise OptBenchError(f"--resume_from_checkpoint '{ckpt}' is damaged ({problem}). Pass another "
                            "checkpoint, or start over.")
    forced = _verify(plan, ckpt, state, str(ckpt))
    _check_steps(plan, ckpt, state, str(ckpt), None)
    return Resumption(ckpt, int(state.get("global_step") or 0), forced)


def _number(ckpt: Path) -> int:
    return int(ckpt.name.split("-")[1])


def _set_aside(out: Path, torn: list[Path], damaged: list[tuple[Path, str]], chosen: Path) -> None:
    """Move torn checkpoints (a kill mid-save) and damaged ones out of transformers' ``checkpoint-*`` rotation; a
    fall-back past a newer one is said on stderr, naming both; the legacy ``checkpoint-*.incomplete`` names of earlier
    versions too."""
    for ckpt in [*torn, *sorted(out.glob("checkpoint-*.incomplete"))]:
        moved = move_torn_checkpoint(ckpt)
        if re.fullmatch(r"checkpoint-\d+", ckpt.name) and _number(ckpt) > _number(chosen):
            print(f"[hf_optbench] {ckpt.name} is incomplete (no {TRAINER_STATE_FILE}: its save was cut short): "
                  f"resuming from {chosen.name}; it is in {moved.relative_to(out)}", file=sys.stderr, flush=True)
    for ckpt, why in damaged:
        moved = move_torn_checkpoint(ckpt)
        print(f"[hf_optbench] {ckpt.name} is damaged ({why}): resuming from {chosen.name}; the damaged one is in "
              f"{moved.relative_to(out)}", file=sys.stderr, flush=True)


def move_torn_checkpoint(ckpt: Path) -> Path:
    """Move a torn checkpoint to ``output_dir/torn_checkpoints/checkpoint-N.<time>`` and return where it went.

    Out of the ``checkpoint-*`` namespace, because transformers' save_total_limit rotation globs ``checkpoint-*``
    and reads any name with a number in it as a checkpoint (a ``checkpoint-8.incomplete`` beside it was counted
    and deleted); under a name of its own, because the same step can be torn twice (a kill mid-save, a resume, a
    second kill at the same save).
    """
    torn_dir = ckpt.parent / TORN_CHECKPOINTS_DIR
    torn_dir.mkdir(exist_ok=True)
    stem = f"{ckpt.name}.{time.strftime('%Y%m%dT%H%M%S')}"
    target, n = torn_dir / stem, 1
    while target.exists():
        target, n = torn_dir / f"{stem}-{n}", n + 1
    ckpt.rename(target)
    return target
