"""Run-directory files: their names, run ids, atomic writes and readers, shared by a run, a sweep and the report.

A run directory is written by one process and read by many (the sweep's progress, the report, `push`), so every
JSON file is replaced atomically: a reader sees the old file or the new one, never half of one. A sweep directory
adds two files of its own, read by the sweep (to restart) and by the report (to name each run's status):
``sweep_state.jsonl`` (one line per event, appended) and ``sweep_manifest.json`` (the matrix).
"""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_optbench.errors import OptBenchError

SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.yaml"
STATE_FILE = "sweep_state.jsonl"
MANIFEST_FILE = "sweep_manifest.json"
TUNED_FILE = "tuned_hparams.yaml"  # what a sweep's tuning phase selected; every comparison run reads it
STDOUT_FILE = "stdout.log"  # a sweep run's console output
TRAINER_STATE_FILE = "trainer_state.json"  # transformers' own, in the run directory and each checkpoint

# A sweep directory's layout: the copied sweep file, one run directory per matrix point under RUNS_DIR, and for a
# sweep with a ``tune:`` section the tuning phase's own sweep directory under TUNING_DIR.
SWEEP_COPY_FILE = "sweep.yaml"
# The optimizer every other is compared against: the sweep's ladder, the report's targets and speedups, the verdict.
# Tuned AdamW, as in the benchmarks the project follows (Marin's optimizer sweep; Kaddour et al. 2023).
BASELINE = "adamw"
RUNS_DIR = "runs"
TUNING_DIR = "tuning"

# A run's final status in summary.json: the one owner of its classification (the run, the sweep state, the records
# and the tuner read these). FINISHED: the run did what it was asked (a divergence is a result, not a failure).
# LOST: it ended without a result. FINAL: it will not change on its own (a sweep does not re-launch it unless asked).
FINISHED_STATUSES = ("completed", "diverged")
LOST_STATUSES = ("failed", "oom")
FINAL_STATUSES = FINISHED_STATUSES + LOST_STATUSES
# A run stopped by Ctrl-C or SIGHUP: not finished, not failed (nothing went wrong), resumable from its checkpoint.
INTERRUPTED = "interrupted"
# What an out-of-memory error says (torch's CUDA "out of memory"/OutOfMemoryError, the CPU allocator's ENOMEM): such a
# run ended for want of memory, a result of its size and optimizer ("oom"), not a bug ("failed").
OOM_PATTERN = re.compile(r"out of memory|OutOfMemoryError|can't allocate memory|Cannot allocate memory", re.I)


def lost_status(*texts: object) -> str:
    """"oom" when any of ``texts`` (an error message, a log tail) says the run ran out of memory, else "failed"."""
    return "oom" if any(OOM_PATTERN.search(str(t)) for t in texts if t) else "failed"


def run_status(measured: str | None, raised: BaseException | None = None) -> str:
    """A run's status in summary.json, decided here for every path that writes one. A divergence the recorder
    measured is a result and wins over how the run ended; a run stopped by Ctrl-C or SIGHUP (``KeyboardInterrupt``)
    is :data:`INTERRUPTED`; one that raised an error is lost (:func:`lost_status`: "oom" when the error says it ran
    out of memory) and one that ended by any other exception "failed"; one that trained to its end is what the
    recorder measured ("completed"). ``measured``: the recorder's status, None before anything was measured (a
    run is "failed" until training says otherwise)."""
    if measured == "diverged":
        return "diverged"
    if isinstance(raised, KeyboardInterrupt):
        return INTERRUPTED
    if raised is not None:
        return lost_status(raised) if isinstance(raised, Exception) else "failed"
    return measured or "failed"


def portable_path(path: str | os.PathLike[str], base: str | os.PathLike[str]) -> str:
    """``path`` as a record may keep it (files that are uploaded or committed: tuned files, summary.json): relative
    to ``base`` (the record's own directory, the run's, the working directory) when it lies below it, else its
    last part; never this machine's absolute path."""
    full, root = Path(os.path.abspath(path)), Path(os.path.abspath(base))
    return str(full.relative_to(root)) if full.is_relative_to(root) and full != root else full.name


def runs_root(sweep_dir: str | os.PathLike[str]) -> Path:
    """Where a sweep directory keeps its run directories (``RUNS_DIR``); a directory without one is itself a
    directory of runs."""
    d = Path(sweep_dir)
    return d / RUNS_DIR if (d / RUNS_DIR).is_dir() else d


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary sibling of ``path`` to write (it keeps ``path``'s suffix, so writers that pick the format from
    the name still work); moved over ``path`` with ``os.replace`` when the block ends, removed if it raises. The one
    owner of the write-then-rename pattern: a reader (a sweep refreshing summary.csv while the report reads it)
    sees the old file or the new one, never half of one."""
    path = Path(path)
    # unique per process and call: three `report`s of one directory at once each write their own temporary file
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        if exc.filename is None:  # a full disk on write() names no file: name the one being written
            exc.filename = str(path)
        raise
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically (:func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` exactly as given (no newline translation) atomically (:func:`atomic_path`)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)
    return Path(path)


# The optional parts of a run id after the seed, in order: (prefix, record key). ``tpp``: the sweep's data budget in
# tokens per parameter this run belongs to, only in a sweep with several (study.budget; its ladder runs keep their
# ratio's and add ``dx``); ``lrx``: the learning rate as a
# multiple of the run's resolved rate (a tuning grid); ``wdx``: the weight decay likewise; ``nmx``: the non-matrix
# group's learning rate as a multiple of learning_rate (optim.adamw.NONMATRIX_KEY, tuned for AdamW and Muon); ``dx``:
# the data budget as a multiple of the sweep's budget (the baseline ladder that the speedup is read from).
ID_PARTS: tuple[tuple[str, str], ...] = (("tpp", "budget_tpp"), ("lrx", "lr_multiplier"), ("wdx", "wd_multiplier"),
                                         ("nmx", "nonmatrix_multiplier"), ("dx", "budget_multiple"))


def run_id_for(optimizer: str, model_size: str, seed: int, lr_multiplier: float | None = None, *,
               wd_multiplier: float | None = None, budget_multiple: float | None = None,
               nonmatrix_multiplier: float | None = None, budget_tpp: float | None = None) -> str:
    """Deterministic, filesystem-safe id of a sweep's matrix point: ``adamw__tiny__s0``, ``lion__mini__s1__lrx0.5``,
    ``adamw__midi__s2__dx4`` or ``muon__tiny__s1__tpp0.5`` (:func:`parse_run_id` reads it back)."""
    rid = f"{optimizer}__{model_size}__s{seed}"
    values = {"lr_multiplier": lr_multiplier, "wd_multiplier": wd_multiplier, "budget_multiple": budget_multiple,
              "nonmatrix_multiplier": nonmatrix_multiplier, "budget_tpp": budget_tpp}
    for prefix, key in ID_PARTS:
        if values[key] is not None:
            rid += f"__{prefix}{values[key]:g}"
    return re.sub(r"[^A-Za-z0-9_.\-]", "-", rid)


def parse_run_id(run_id: str) -> dict[str, Any]:
    """optimizer / model_size / seed (/ budget_tpp, lr_multiplier, wd_multiplier, budget_multiple) of an id made by
    :func:`run_id_for`; {} for another name."""
    parts = run_id.split("__")
    out: dict[str, Any] = {}
    if len(parts) >= 3 and parts[2].startswith("s") and parts[2][1:].isdigit():
        out = {"optimizer": parts[0], "model_size": parts[1], "seed": int(parts[2][1:])}
        for part in parts[3:]:
            for prefix, key in ID_PARTS:
                if part.startswith(prefix):
                    try:
                        out[key] = float(part[len(prefix):])
                    except ValueError:
                        continue
                    break
    return out


def read_summary(run_dir: str | os.PathLike[str], *, required: bool = False) -> dict[str, Any] | None:
    """A run's summary.json. Missing or unreadable: None, or with ``required`` an OptBenchError that names the fix."""
    path = Path(run_dir) / SUMMARY_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError:
        if not required:
            return None
        raise OptBenchError(
            f"'{run_dir}' has no {SUMMARY_FILE}: it is not an hf_optbench run directory, or the run has not "
            "finished. Point at a run's output_dir (the folder holding summary.json and metrics.jsonl)."
        ) from None
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not UTF-8
        if not required:
            return None
        raise OptBenchError(f"{path} is not valid JSON ({_short(exc)}): re-run or repair the run directory.") from None
    if not isinstance(data, dict):
        if not required:
            return None
        raise OptBenchError(f"{path} does not hold a JSON object: re-run or repair the run directory.")
    return data


def _short(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc)[:120]}"


def read_json_lines(path: Path, what: str) -> list[dict[str, Any]]:
    """The JSON objects of a ``.jsonl`` file, one per line, in order; [] when there is no file. A line that is not
    one (bytes that are not UTF-8, not JSON, a JSON list or number) is skipped with one warning per file naming
    the file and its line numbers; a last line cut short without its newline (a writer killed mid-write, which
    any appender may leave) is skipped silently. Why line by line, as bytes: one bad record (trailing binary bytes,
    a ``[]`` line) must not make the whole file unreadable, and never a UnicodeDecodeError traceback."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    rows: list[dict[str, Any]] = []
    bad: list[int] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError and JSONDecodeError
            row = None
            torn = number == len(lines)  # the last line, no newline after it
            if torn and _is_text(raw):
                continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad.append(number)
    if bad:
        import warnings

        shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        warnings.warn(f"{path}: skipped {len(bad)} unreadable {what} line(s) (line {shown}: not a JSON object "
                      "in UTF-8)", UserWarning, stacklevel=2)
    return rows


def _is_text(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _step(row: dict[str, Any]) -> int | None:
    """A metrics row's step as an int (None for a row without a usable one: it cannot be placed on the curve)."""
    step = row.get("step", -1)
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step):
        return None
    return int(step)


def read_metrics(run_dir: str | os.PathLike[str]) -> dict[str, list[dict[str, Any]]]:
    """metrics.jsonl split by kind, the last row per (kind, step) kept (a resumed run may repeat a step); a torn
    last line (a run killed mid-write) is skipped, and a line that is no metrics row (not a JSON object, a step
    that is not a number) is skipped with a warning naming the file and line (:func:`read_json_lines`)."""
    by_kind: dict[str, dict[int, dict[str, Any]]] = {}
    path = Path(run_dir) / METRICS_FILE
    rows = read_json_lines(path, "metrics")
    bad = [row for row in rows if _step(row) is None]
    if bad:
        import warnings

        warnings.warn(f"{path}: skipped {len(bad)} metrics row(s) whose step is not a number (e.g. "
                      f"{json.dumps(bad[0])[:80]})", UserWarning, stacklevel=2)
    for row in rows:
        step = _step(row)
        if step is not None:
            by_kind.setdefault(str(row.get("kind")), {})[step] = row
    return {k: [v[s] for s in sorted(v)] for k, v in by_kind.items()}


def append_state(path: Path, row: dict[str, Any]) -> None:
    """Append one JSON line to a sweep's state file with a single O_APPEND write (a crash leaves at most a torn
    last line, which :func:`read_state` skips) and fsync it."""
    data = (json.dumps(row, sort_keys=True, default=str) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_state(path: Path) -> list[dict[str, Any]]:
    """Every event row of a sweep's state file, oldest first; [] when there is none yet. A torn line from a killed
    writer is skipped; any other line that is no JSON object, with a warning naming it (:func:`read_json_lines`)."""
    return read_json_lines(path, "sweep state")


def finished_status(run_dir: Path, rows: Sequence[dict[str, Any]], run_id: str) -> str | None:
    """The final status of a run, or None when it still has to run. summary.json is the truth; a crash that
    left none is final when the sweep recorded its end for the current directory."""
    summary = read_summary(run_dir)
    if summary and summary.get("status") in FINAL_STATUSES:
        return str(summary["status"])
    ends = [r for r in rows if r.get("run_id") == run_id and r.get("event") == "end"]
    moved = [r for r in rows if r.get("run_id") == run_id and r.get("event") == "moved"]
    if ends and ends[-1].get("status") in FINAL_STATUSES and run_dir.is_dir():
        if not moved or ends[-1].get("time", 0) > moved[-1].get("time", 0):
            return str(ends[-1]["status"])
    return None


# A run's own bookkeeping files (written by the run layer, read back by a resumed run of the same directory).
RUN_LOCK_FILE = "run.lock"  # the flock that makes one process the owner of a run directory (hf_optbench.run.lock)
SEGMENTS_FILE = "train_segments.json"  # one entry per training process of the run (hf_optbench.run.segments)
TORN_CHECKPOINTS_DIR = "torn_checkpoints"  # checkpoints a kill tore mid-save, kept out of checkpoint-* rotation
# The plan's identity of the run, recorded for readers (the report compares runs by it); a resume checks the stamp
# in the checkpoint it loads instead (hf_optbench.run.identity), never this file.
IDENTITY_FILE = "run_identity.json"
# The key of the plan stamp in each checkpoint's trainer_state.json (hf_optbench.run.identity.PlanStamp):
# transformers keys ``stateful_callbacks`` by the callback's class name.
STAMP_KEY = "PlanStamp"


def read_identity(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The identity recorded in a run directory's ``run_identity.json``, or None (none written, or unreadable)."""
    try:
        data = json.loads((Path(run_dir) / IDENTITY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ident = data.get("identity") if isinstance(data, dict) else None
    return ident if isinstance(ident, dict) else None


def read_segments(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The training segments recorded in a run directory (one per process that trained it), oldest first; [] when
    there is no readable file."""
    try:
        data = json.loads((Path(run_dir) / SEGMENTS_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return []
    segments = data.get("segments") if isinstance(data, dict) else None
    return [s for s in segments if isinstance(s, dict)] if isinstance(segments, list) else []


# ------------------------------------------------------------------------------------- what an output_dir holds
# The final model a run saves into its directory once summary.json is written (run.output.save_final_model:
# trainer.save_model, sharded past 5 GB): a directory that holds one held a run that trained to its end.
FINAL_MODEL_FILES = ("model.safetensors", "model.safetensors.index.json")
# How much of metrics.jsonl's end is read for its last training step: a train row is ~250 bytes, so 64 KiB holds
# the last ~250 rows, eval and memory rows among them; never the whole file (a long run's is hundreds of MB).
METRICS_TAIL_BYTES = 1 << 16


@dataclass(frozen=True)
class PreviousRun:
    """What an ``output_dir`` holds of an earlier run, decided from every record a run leaves, not summary.json
    alone (a finished run whose summary.json was cut short or deleted must not be taken for an empty directory
    and overwritten):

    - ``finished``: summary.json says so (status completed or diverged);
    - ``damaged``: summary.json is there but unreadable or holds no status, or it is missing while the run's other
      records say it trained to its end (its final model, or, with no checkpoint to finish it from, metrics.jsonl
      reaching the max_steps its run_identity.json records); ``why`` names what is damaged and what says so;
    - ``unfinished``: other records of a run (run_identity.json, metrics.jsonl, train_segments.json, a
      summary.json of a failed run, checkpoints) and nothing that says it finished;
    - ``none``: no record of a run (a new or empty directory, or a user's folder: :func:`foreign_files` answers that).
    """

    state: str
    why: str = ""
    status: str | None = None
    last_step: int | None = None
    checkpoints: bool = False


def last_train_step(run_dir: str | os.PathLike[str]) -> int | None:
    """The step of the last training row of ``run_dir``'s metrics.jsonl, read from its end only
    (:data:`METRICS_TAIL_BYTES`); None without one."""
    path = Path(run_dir) / METRICS_FILE
    try:
        with open(path, "rb") as fh:
            fh.seek(max(fh.seek(0, os.SEEK_END) - METRICS_TAIL_BYTES, 0))
            tail = fh.read()
    except OSError:
        return None
    for raw in reversed(tail.split(b"\n")):
        try:
            row = json.loads(raw.decode("utf-8"))
        except ValueError:  # a torn line, the first (partial) line of the tail, bytes that are not UTF-8
            continue
        if isinstance(row, dict) and row.get("kind") == "train" and _step(row) is not None:
            return _step(row)
    return None


def _summary_problem(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(summary.json's object, None), or (None, what is wrong with it) for a file that is there but unreadable."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        size = path.stat().st_size
        return None, f"{SUMMARY_FILE} is not readable JSON ({size} bytes, {_short(exc)}: cut short by a crash or a " \
                     "full disk, or edited)"
    except OSError as exc:
        return None, f"{SUMMARY_FILE} cannot be read ({exc.strerror or exc})"
    if not isinstance(data, dict):
        return None, f"{SUMMARY_FILE} does not hold a JSON object"
    return data, None


def previous_run(run_dir: str | os.PathLike[str]) -> PreviousRun:
    """What ``run_dir`` holds of an earlier run (:class:`PreviousRun`); cheap: a few small files and the end of
    metrics.jsonl."""
    out = Path(run_dir)
    if not out.is_dir():
        return PreviousRun("none")
    checkpoints = any(p.name.startswith("checkpoint-") for p in out.iterdir())
    last = last_train_step(out)
    model = next((n for n in FINAL_MODEL_FILES if (out / n).is_file()), None)
    records = [n for n in (IDENTITY_FILE, METRICS_FILE, SEGMENTS_FILE) if (out / n).is_file()]
    steps = f"metrics.jsonl up to step {last}" if last is not None else ""
    summary_path = out / SUMMARY_FILE
    if summary_path.is_file():
        summary, problem = _summary_problem(summary_path)
        status = (summary or {}).get("status")
        if summary is not None and status in FINISHED_STATUSES:
            return PreviousRun("finished", f"{SUMMARY_FILE} status '{status}'", status, last, checkpoints)
        if summary is not None and status not in (*FINAL_STATUSES, INTERRUPTED):
            problem = f"{SUMMARY_FILE} holds no run status (status {status!r})"
        if problem is not None:
            kept = [f"the final model ({model})" if model else "", steps]
            return PreviousRun("damaged", problem + _beside(kept), None, last, checkpoints)
        return PreviousRun("unfinished", f"{SUMMARY_FILE} status '{status}'", status, last, checkpoints)
    max_steps = (read_identity(out) or {}).get("max_steps")
    if model is not None:
        return PreviousRun("damaged", f"{SUMMARY_FILE} is missing, though the run saved its final model ({model}), "
                           "which it does only after summary.json" + _beside([steps]), None, last, checkpoints)
    if last is not None and isinstance(max_steps, int) and last >= max_steps and not checkpoints:
        # with checkpoints, the run may have stopped before its last one was written: a resume finishes it
        return PreviousRun("damaged", f"{SUMMARY_FILE} is missing, though metrics.jsonl reaches step {last}, the "
                           f"run's max_steps ({IDENTITY_FILE}): it trained to its end", None, last, checkpoints)
    if records or checkpoints:
        what = f"{steps}, no {SUMMARY_FILE}" if steps else f"{', '.join(records) or 'checkpoints'}, no step recorded"
        return PreviousRun("unfinished", what, None, last, checkpoints)
    return PreviousRun("none")


# What a run writes at the top of its output_dir that a user's folder may hold too: the card, the final model
# (trainer.save_model), the tokenizer files saved beside it, the rerunnable config.
RUN_WRITES = ("README.md", CONFIG_FILE, "config.json", "generation_config.json", "model.safetensors",
              "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "tokenizer.model",
              "training_args.bin", TRAINER_STATE_FILE)
# What only a run's own bookkeeping writes: a directory holding one of them is a run directory.
RUN_MARKERS = (IDENTITY_FILE, SUMMARY_FILE, METRICS_FILE, SEGMENTS_FILE)


def _stamped(checkpoint: Path) -> bool | None:
    """Whether ``checkpoint``'s trainer_state.json carries hf_optbench's plan stamp (True), another writer's
    state (False), or there is none (None: a checkpoint torn mid-save). The key is looked for in the bytes, so a
    damaged or huge file costs one read and no parse."""
    try:
        return f'"{STAMP_KEY}"'.encode() in (checkpoint / TRAINER_STATE_FILE).read_bytes()
    except FileNotFoundError:
        return None
    except OSError:
        return False


def foreign_files(out: Path) -> list[str]:
    """What in ``out`` no hf_optbench run wrote and a run would replace or delete (``--overwrite_output_dir`` clears
    a run's files and every ``checkpoint-*``; the Trainer's rotation deletes old checkpoints): another tool's
    Trainer checkpoint (its trainer_state.json without the plan stamp), and, in a folder that is no run's, the
    files a run writes (README.md, config.json, ...). A torn checkpoint (no trainer_state.json) of a run's own
    directory is the run's. Files a run never writes or deletes (``notes.txt``) are not listed."""
    if not out.is_dir():
        return []
    checkpoints = sorted(p for p in out.iterdir() if p.name.startswith("checkpoint-") and p.is_dir())
    stamps = {p: _stamped(p) for p in checkpoints}
    run_dir = any((out / name).exists() for name in RUN_MARKERS) or any(stamps.values())
    theirs = [f"{p.name}/" for p, stamped in stamps.items() if stamped is False or (stamped is None and not run_dir)]
    if not run_dir:
        theirs += [name for name in RUN_WRITES if (out / name).exists()]
    return theirs


def check_no_foreign_files(out: Path) -> None:
    """Refuse (exit 2, nothing touched) an output_dir holding files no hf_optbench run wrote that a run would replace
    or delete (:func:`foreign_files`), naming them; ``--overwrite_output_dir`` does not lift it: it deletes only what
    a run wrote."""
    theirs = foreign_files(out)
    if theirs:
        shown = ", ".join(theirs[:8]) + (f" and {len(theirs) - 8} more" if len(theirs) > 8 else "")
        raise OptBenchError(
            f"output_dir '{out}' holds files no hf_optbench run wrote ({shown}), which a run would replace or delete "
            "(a checkpoint-* without hf_optbench's plan stamp is another tool's), also with --overwrite_output_dir "
            "true. Move them out of it, or choose a new --output_dir.")


def _beside(parts: Sequence[str]) -> str:
    kept = [p for p in parts if p]
    return f"; still there: {', '.join(kept)}" if kept else ""
