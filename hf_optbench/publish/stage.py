"""What an upload to the Hub sends: a staged folder of a finished run's files, each checked before anything leaves
the machine. The upload itself (``push``, ``--push_to_hub``) is :mod:`hf_optbench.publish.hub`.

Why a staged folder instead of ``output_dir``: a run directory also holds pickles (``training_args.bin``,
``optimizer.pt``, ``rng_state.pth``). The Hub gets the files a user needs to load the model and read the benchmark
(safetensors weights, config, tokenizer, card, ``metrics.jsonl``, ``summary.json``), each a regular file inside the
run directory (a symbolic link, or a shard index naming a path outside it, is refused: it would upload what it
points at), each checked by name and by content (:mod:`hf_optbench.publish.content`) for pickles (every member of
every archive, compressed streams and numpy arrays too), binary content under a text name, and secrets
(:mod:`hf_optbench.publish.redact`: the tokens and keys of the Hub, GitHub, OpenAI, Anthropic, W&B, Slack, GitLab,
Google and AWS, netrc credentials, private keys, high-entropy ``*_KEY``/``*_TOKEN`` values). ``push`` and its dry run
stage in a temporary folder, removed afterwards, unless given ``--stage_dir``: the run directory is never written,
and a staging folder is cleared for a new staging only when it holds exactly what an earlier one recorded in its
manifest (:data:`STAGE_MARKER`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hf_optbench.errors import OptBenchError
from hf_optbench.publish.card import build_model_card
from hf_optbench.publish.content import PICKLE_SUFFIXES, upload_file_problems
from hf_optbench.publish.redact import redact_text, scrub_secrets
from hf_optbench.rundir import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, read_summary, write_json_atomic

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
MODEL_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "added_tokens.json", "chat_template.jinja", "tokenizer.model")
DEFAULT_STAGE_DIRNAME = "hub_upload"
# The manifest a staging leaves in its folder: each file it wrote, with the size, modification time and inode it
# left it with. Only a folder holding exactly those files (or nothing) is ever cleared for the next staging.
STAGE_MARKER = ".hf_optbench_stage"

def known_token() -> str | None:
    """The token huggingface_hub would use (env or login cache), to search staged files for it literally."""
    from huggingface_hub import get_token

    return get_token()


# ------------------------------------------------------------------------------------------- upload folder


def _checkpoint_step(path: Path) -> int:
    try:
        return int(path.name.split("-", 1)[1])
    except (IndexError, ValueError):
        return -1


def _has_weights(folder: Path) -> bool:
    return any((folder / name).is_file() for name in WEIGHT_FILES)


def find_weights_dir(run_dir: str | os.PathLike[str]) -> Path:
    """Where the run's final weights are: ``run_dir`` itself if the final model was saved there, else its
    latest ``checkpoint-N`` (Trainer saves one at the last step)."""
    run_dir = Path(run_dir)
    if _has_weights(run_dir):
        return run_dir
    checkpoints = sorted((p for p in run_dir.glob("checkpoint-*") if p.is_dir() and _has_weights(p)),
                         key=_checkpoint_step)
    if checkpoints:
        return checkpoints[-1]
    pickled = [p.name for p in run_dir.glob("*") if p.suffix in PICKLE_SUFFIXES]
    extra = f" (found only pickled {pickled}: re-save them as safetensors)" if pickled else ""
    raise OptBenchError(
        f"no safetensors weights in '{run_dir}' or its checkpoint-* folders{extra}. Run with checkpoints "
        "enabled (--save_strategy steps --save_steps N; one is saved at the last step) before pushing."
    )


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # no second copy of multi-GB weights on disk
    except OSError:
        shutil.copy2(src, dst)


def check_upload_folder(folder: str | os.PathLike[str], token: str | None = None) -> list[str]:
    """Problems that must stop an upload (empty list = fine): missing weights/config/card, and every problem
    :func:`~hf_optbench.publish.content.upload_file_problems` finds in a file (pickles, secrets, ``token``)."""
    folder = Path(folder)
    problems: list[str] = []
    if not _has_weights(folder):
        problems.append("no model.safetensors (or model.safetensors.index.json)")
    for name in ("config.json", "README.md"):
        if not (folder / name).is_file():
            problems.append(f"missing {name}")
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != STAGE_MARKER):
        problems += upload_file_problems(path, path.relative_to(folder), token)
    return problems


def _exists(path: Path) -> bool:
    return path.is_file() or path.is_symlink()  # a dangling or outside link is there too, to be refused by name


def _shards(index: Path) -> list[str]:
    """The shard file names a ``model.safetensors.index.json`` maps weights to, each a bare ``.safetensors`` name
    beside the index: an absolute path or ``../`` would stage a file from outside the run (a credentials file)."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        shards = sorted({str(v) for v in weight_map.values()})
    except (OSError, ValueError, AttributeError) as exc:
        raise OptBenchError(f"'{index}' is not a readable shard index ({type(exc).__name__}): fix or remove it, and "
                            "stage again.") from None
    for shard in shards:
        if Path(shard).name != shard or shard in (".", "..") or not shard.endswith(".safetensors"):
            raise OptBenchError(f"'{index}': its weight_map names '{shard}', not a .safetensors file beside the index "
                                "(an absolute or ../ path would upload a file from outside the run). Fix the index.")
    return shards


def _files_to_upload(source: Path, run_dir: Path) -> list[Path]:
    """Weights (with every shard the index names), model config and tokenizer files of the model in ``source``."""
    files: list[Path] = [source / n for n in WEIGHT_FILES + MODEL_FILES if _exists(source / n)]
    index = source / "model.safetensors.index.json"
    if index.is_file() and not index.is_symlink():
        files += [source / shard for shard in _shards(index)]
    for name in TOKENIZER_FILES:  # the checkpoint's copy first, else the one saved at the run's top level
        for where in (source, run_dir):
            if _exists(where / name):
                files.append(where / name)
                break
    return files


def check_source(src: Path, run_dir: Path) -> Path:
    """``src`` when it may be staged: a regular file, not a symbolic link, whose real path lies inside the run
    directory; else OptBenchError naming it and why. A link (``tokenizer.json`` -> a secret file) or a checkpoint
    folder linked elsewhere would upload content from outside the run under an innocent name."""
    if src.is_symlink():
        raise OptBenchError(f"'{src}' is a symbolic link (to '{os.readlink(src)}'): push uploads only the run "
                            "directory's own files, never what a link points at. Replace the link by the file, or "
                            "remove it.")
    real, root = src.resolve(), run_dir.resolve()
    if not real.is_relative_to(root):
        raise OptBenchError(f"'{src}' lies outside the run directory (it is '{real}'): push uploads only files "
                            f"inside '{run_dir}'. Copy the file into the run directory, or remove the link.")
    if not real.is_file():
        raise OptBenchError(f"'{src}' is missing or not a regular file: the checkpoint is incomplete.")
    return src


def _stat(path: Path) -> list[int]:
    st = path.lstat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _manifest(dest: Path) -> dict[str, list[int]] | None:
    """The files an earlier staging recorded in ``dest`` ({name: [size, mtime_ns, inode]}), or None when it left no
    readable manifest (never staged there, or an older hf-optbench's marker that listed nothing)."""
    try:
        files = json.loads((dest / STAGE_MARKER).read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    return files if isinstance(files, dict) else None


def _ours(path: Path, recorded: list[int] | None) -> bool:
    """Whether ``path`` is as the staging that recorded it left it: same size and time, or still the hard link it
    made to the run's own file (the run may have rewritten that file in place since)."""
    if recorded is None or path.is_dir() and not path.is_symlink():
        return False
    now = _stat(path)
    return now[:2] == recorded[:2] or (now[2] == recorded[2] and path.lstat().st_nlink > 1)


def record_staged(dest: Path, *names: str) -> None:
    """Add ``names`` (files just written into ``dest``) to its manifest, atomically."""
    files = _manifest(dest) or {}
    files.update({name: _stat(dest / name) for name in names})
    write_json_atomic(dest / STAGE_MARKER, {"made_by": "hf_optbench.publish.stage", "files": files})


def _new_stage_dir(dest: Path) -> None:
    """Make ``dest`` ready for a staging: created when missing; an empty folder is used as it is; a folder an earlier
    staging left is emptied, file by file, only when it holds exactly what that staging recorded. Anything else
    (a file of the user's, one changed since, a folder that was never a staging folder) is refused by name, and
    nothing is removed."""
    if dest.is_symlink() or dest.exists() and not dest.is_dir():
        raise OptBenchError(f"staging folder '{dest}' is not a folder (a file or a link): choose another --stage_dir.")
    entries = sorted(p.name for p in dest.iterdir()) if dest.exists() else []
    if entries:
        recorded = _manifest(dest)
        foreign = [n for n in entries if n != STAGE_MARKER and not _ours(dest / n, (recorded or {}).get(n))]
        if recorded is None or foreign:
            shown = ", ".join(foreign[:8]) + (f" and {len(foreign) - 8} more" if len(foreign) > 8 else "")
            raise OptBenchError(
                f"staging folder '{dest}' holds files no earlier staging by hf-optbench wrote"
                + (" (or that changed since)" if recorded is not None else "")
                + f": {shown}. It is never cleared or replaced while it holds them: choose another --stage_dir (or "
                "an empty folder), or move those files away yourself."
            )
        for name in entries:
            if name != STAGE_MARKER:
                (dest / name).unlink()
        (dest / STAGE_MARKER).unlink(missing_ok=True)
    dest.mkdir(parents=True, exist_ok=True)
    record_staged(dest)


def assemble(run_dir: Path, dest: Path, source: Path, *, with_summary: bool) -> None:
    """Link the model files of ``source`` into a fresh ``dest``; copy ``metrics.jsonl`` (a snapshot: the run may
    still append to it); with ``with_summary``, write the scrubbed ``summary.json`` and ``config.yaml`` (the card's
    Reproduce line reruns it). Fast: nothing else is read."""
    files = [check_source(src, run_dir) for src in _files_to_upload(source, run_dir)]  # before anything is made
    _new_stage_dir(dest)
    for src in files:
        _link_or_copy(src, dest / src.name)
        record_staged(dest, src.name)  # each file as soon as it is there: a staging cut short is cleared next time
    if _exists(run_dir / METRICS_FILE):
        shutil.copyfile(check_source(run_dir / METRICS_FILE, run_dir), dest / METRICS_FILE)
        record_staged(dest, METRICS_FILE)
    if with_summary:
        write_json_atomic(dest / SUMMARY_FILE, scrub_secrets(read_summary(run_dir, required=True)))
        record_staged(dest, SUMMARY_FILE)
        if _exists(run_dir / CONFIG_FILE):
            text = check_source(run_dir / CONFIG_FILE, run_dir).read_text(encoding="utf-8")
            (dest / CONFIG_FILE).write_text(_portable_config(redact_text(text)), encoding="utf-8")
            record_staged(dest, CONFIG_FILE)


def _portable_config(text: str) -> str:
    """The uploaded config.yaml without this machine's paths: every absolute path a value holds (output_dir,
    data_files, tuned_hparams_file, a local tokenizer or init_from directory; a list's items too) becomes its last
    part (``/home/me/runs/x`` -> ``x``), in the values and in the rerun comment above them. A reader of the Hub
    repo has none of those paths; the name says what to put in its place."""
    import yaml

    try:
        values = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return text
    if not isinstance(values, dict):
        return text
    found = set()
    for value in values.values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and os.path.isabs(item) and os.sep in item.rstrip(os.sep):
                found.add(item.rstrip(os.sep))
    for path in sorted(found, key=len, reverse=True):  # a longer path first: one may hold another
        text = re.sub(re.escape(path) + r"(?![\w.-])", Path(path).name, text)
    return text


def finish_stage(dest: Path, card: Any, token: str | None, run_dir: Path | None = None) -> Path:
    (dest / "README.md").write_text(str(card), encoding="utf-8")
    record_staged(dest, "README.md")
    problems = check_upload_folder(dest, token=token if token is not None else known_token())
    if problems:
        raise OptBenchError(
            f"nothing uploaded: the files staged from '{run_dir or dest}' failed their checks: " + "; ".join(problems)
            + ". Fix the run directory (weights as safetensors, no secrets in any file) and stage again."
        )
    return dest


def stage_upload_folder(run_dir: str | os.PathLike[str], dest: str | os.PathLike[str] | None = None, *,
                        repo_id: str | None = None, token: str | None = None) -> Path:
    """Assemble exactly what an upload of this finished run sends, and check it.

    The folder (``dest``; default ``run_dir/hub_upload``: ``push`` uses :func:`staged_upload` instead) holds the final safetensors weights (and shard index), config.json,
    generation_config.json if any, the tokenizer files, ``metrics.jsonl``, ``summary.json`` and ``config.yaml``
    (secrets removed) and README.md (the benchmark model card). Raises OptBenchError listing the problems :func:`check_upload_folder`
    finds (e.g. a token string)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise OptBenchError(f"run directory '{run_dir}' does not exist: pass a run's output_dir.")
    for name in (SUMMARY_FILE, CONFIG_FILE):  # the card reads them: never through a link out of the run
        if _exists(run_dir / name):
            check_source(run_dir / name, run_dir)
    card = build_model_card(run_dir, repo_id=repo_id)  # fails early without summary.json
    dest = Path(dest) if dest is not None else run_dir / DEFAULT_STAGE_DIRNAME
    assemble(run_dir, dest, find_weights_dir(run_dir), with_summary=True)
    return finish_stage(dest, card, token, run_dir)


@contextmanager
def staged_upload(run_dir: str | os.PathLike[str], stage_dir: str | os.PathLike[str] | None = None, *,
                  repo_id: str | None = None, token: str | None = None) -> Iterator[Path]:
    """:func:`stage_upload_folder` into ``stage_dir`` (kept, as asked), else into a temporary folder removed when
    the block ends: ``push`` and ``push --dry-run`` never write into the run directory (a ``hub_upload/`` left
    there surprised users, and a run directory may be read-only). The temporary folder sits beside the run
    directory when its parent may be written, so that weights are hard-linked rather than copied (a hidden name:
    a sweep's ``runs/`` never takes it for a run), else in the system's temporary directory."""
    if stage_dir is not None:
        yield stage_upload_folder(run_dir, stage_dir, repo_id=repo_id, token=token)
        return
    try:
        tmp = Path(tempfile.mkdtemp(prefix=".hf_optbench_stage-", dir=Path(run_dir).resolve().parent))
    except OSError:
        tmp = Path(tempfile.mkdtemp(prefix="hf_optbench_stage-"))
    try:
        yield stage_upload_folder(run_dir, tmp / DEFAULT_STAGE_DIRNAME, repo_id=repo_id, token=token)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
