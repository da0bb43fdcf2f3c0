"""Sources -> tokenize -> pack into blocks -> fixed train/eval split -> memory-mapped cache.

Why each step is here and not left to the defaults:
- Sources. The Hub (``allenai/c4`` config ``th`` streamed: mC4 Thai, since ``mc4`` is a loading script that
  datasets >= 4 refuses), local files (txt, jsonl/json[.gz] in the c4 layout, parquet), the shipped Thai sample and
  the synthetic hidden-Markov source. Hub and local c4 go through the same ``json`` builder with the same explicit
  features (its ``timestamp`` column is auto-parsed otherwise and one odd value raises), then the same reader.
- Split. Documents, not blocks, are held out (no document straddles train and eval), by a systematic sample whose
  start comes from ``split_seed``: the eval set depends on the data settings only, never on the training seed or
  the optimizer, and with ``validation_blocks`` set it stays identical as the training budget grows.
- Packing. ``run_clm``'s group_texts drops every map batch's remainder; we carry it over (by hand: datasets.map is
  stateless across batches) so only the final partial block of each split is dropped.
- Cache. The packed DatasetDict is saved under a fingerprint of everything that decides the token ids (source
  identity, tokenizer.json hash, block size, limits, split) and reloaded memory-mapped, so a second run starts
  without tokenizing and DataLoader workers share pages (seed 003 found loading dominating step time). Local
  files are keyed by path, size and mtime; Hub data by name/config/split (assumed immutable).
"""

from __future__ import annotations

import codecs
import glob
import gzip
import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_optbench.data_config import DataArguments
from hf_optbench.errors import OptBenchError

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedTokenizerBase

PIPELINE_VERSION = 1  # bump when the packing/split logic changes: it is part of every cache key
THAI_SAMPLE_FILE = Path(__file__).resolve().parent / "resources" / "thai" / "thai_sample.jsonl"
_SUFFIX_BUILDERS = (
    (".jsonl.gz", "json"),
    (".json.gz", "json"),
    (".jsonl", "json"),
    (".json", "json"),
    (".txt.gz", "text"),
    (".txt", "text"),
    (".parquet", "parquet"),
)
_C4_COLUMNS = ("text", "timestamp", "url")
_TOKENIZE_BATCH = 1000
_BUDGET_BATCH = 256
_PACK_READ_BATCH = 2048


@dataclass
class DatasetBundle:
    """What a run needs from the data side. ``train``/``eval`` hold ``input_ids`` and ``labels`` (int32 lists)."""

    train: datasets.Dataset
    eval: datasets.Dataset
    tokenizer: PreTrainedTokenizerBase | None
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    info: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ local files
@dataclass
class LocalFiles:
    """Resolved local inputs: sorted files, the datasets builder that reads them, and whether it is the c4 layout."""

    files: list[str]
    builder: str
    c4_layout: bool = False


def _builder_for(path: str) -> str | None:
    low = path.lower()
    return next((b for suffix, b in _SUFFIX_BUILDERS if low.endswith(suffix)), None)


def _c4_files(directory: str, config: str, split: str) -> list[str]:
    pattern = f"c4-{config}-validation.*.json.gz" if split == "validation" else f"c4-{config}.*.json.gz"
    for base in (os.path.join(directory, "multilingual"), directory):
        found = sorted(glob.glob(os.path.join(base, pattern)))
        if found:
            return found
    return []


def expand_data_files(data_files: Sequence[str], *, config: str | None = "th", split: str = "train") -> list[str]:
    """Files, globs and directories -> a sorted, de-duplicated file list (see :func:`resolve_local_files`)."""
    return resolve_local_files(data_files, config=config, split=split).files


def resolve_local_files(data_files: Sequence[str], *, config: str | None = "th", split: str = "train") -> LocalFiles:
    """Expand ``data_files``; a directory in the c4 layout yields its ``c4-<config>[-validation].*.json.gz`` files."""
    if isinstance(data_files, str):
        data_files = [data_files]
    files: list[str] = []
    c4_layout = False
    for entry in data_files:
        path = os.path.expanduser(entry)
        if os.path.isdir(path):
            c4 = _c4_files(path, config or "th", split)
            if c4:
                files += c4
                c4_layout = True
                continue
            found = sorted(
                p for p in glob.glob(os.path.join(path, "**", "*"), recursive=True) if os.path.isfile(p) and _builder_for(p)
            )
            if not found:
                raise OptBenchError(
                    f"data_files directory {entry!r} holds no .txt/.jsonl/.json[.gz]/.parquet files and no c4 layout "
                    f"(multilingual/c4-{config}.*.json.gz). Point data_files at the files themselves."
                )
            files += found
        elif any(ch in path for ch in "*?["):
            found = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
            if not found:
                raise OptBenchError(f"data_files pattern {entry!r} matches no file. Check the path and the pattern.")
            files += found
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise OptBenchError(f"data_files entry not found: {entry!r}. Give an existing file, glob or directory.")
    files = list(dict.fromkeys(os.path.abspath(f) for f in files))
    builders = {_builder_for(f) for f in files}
    if None in builders:
        bad = next(f for f in files if _builder_for(f) is None)
        raise OptBenchError(
            f"unsupported data file type: {bad!r}. Use .txt, .jsonl, .json, .json.gz, .jsonl.gz or .parquet."
        )
    if len(builders) > 1:
        raise OptBenchError(
            f"data_files mix formats ({', '.join(sorted(b for b in builders if b))}); use one format per run."
        )
    return LocalFiles(files=files, builder=builders.pop(), c4_layout=c4_layout)


def _head_bytes(path: str, n: int = 1 << 16) -> bytes:
    opener = gzip.open if path.lower().endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            return fh.read(n)
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise OptBenchError(f"data file {path!r} cannot be read ({exc}). Check that it is not truncated or mislabelled.") from exc


def check_local_files(local: LocalFiles) -> None:
    """Reject empty and binary files before any loading (each a clear error naming the file)."""
    for path in local.files:
        if os.path.getsize(path) == 0:
            raise OptBenchError(f"data file is empty: {path!r}. Remove it from data_files or fill it.")
        if local.builder == "parquet":
            with open(path, "rb") as fh:
                if fh.read(4) != b"PAR1":
                    raise OptBenchError(f"data file {path!r} is not a Parquet file (no PAR1 magic). Fix the file or its suffix.")
            continue
        head = _head_bytes(path)
        if not head.strip():
            raise OptBenchError(f"data file is empty (no text): {path!r}. Remove it from data_files or fill it.")
        if b"\x00" in head:
            raise OptBenchError(f"data file {path!r} looks binary (NUL bytes), not UTF-8 text. Pass text, jsonl or parquet files.")
        try:  # incremental: a multi-byte character cut at the end of the sample is not an error
            codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
        except UnicodeDecodeError as exc:
            raise OptBenchError(f"data file {path!r} is not UTF-8 text ({exc.reason} at byte {exc.start}). Convert it to UTF-8.") from exc
        if local.builder == "json" and head.lstrip()[:1] not in (b"{", b"["):
            raise OptBenchError(f"data file {path!r} is not JSON lines (first character is not '{{'). Use .txt for plain text.")


def _json_features(local: LocalFiles, text_column: str) -> Any:
    """Explicit features for the json builder, or None to let it infer.

    Why: pyarrow infers ``timestamp`` columns (c4) as timestamps and a single malformed or differently-zoned value
    then raises mid-run; declaring scalar columns as they appear in the first record (strings stay strings) avoids it.
    """
    import datasets

    if local.c4_layout:
        return datasets.Features({c: datasets.Value("string") for c in _C4_COLUMNS})
    first = _head_bytes(local.files[0]).lstrip()
    if first[:1] != b"{":
        return None
    try:
        record = json.loads(first.split(b"\n", 1)[0])
    except ValueError:
        return None
    kinds = {str: "string", bool: "bool", int: "int64", float: "float64"}
    if not isinstance(record, dict) or any(type(v) not in kinds and v is not None for v in record.values()):
        return None  # nested values: leave inference to datasets
    if text_column in record and not isinstance(record[text_column], str):
        return None  # reported by the column check with a clear message
    return datasets.Features({k: datasets.Value(kinds.get(type(v), "string")) for k, v in record.items()})


# ---------------------------------------------------------------------------------------------------- streams
@dataclass
class _Stream:
    """A text source, opened lazily: its identity (for the cache key) is known without touching the data."""

    opener: Callable[[], Any]  # -> datasets.IterableDataset
    text_column: str
    description: str
    identity: dict[str, Any]
    strip_newlines: bool = False  # the text builder leaves a file's final newline on the last paragraph
    _dataset: Any = None

    @property
    def dataset(self) -> Any:
        if self._dataset is None:
            self._dataset = self.opener()
        return self._dataset


def _file_identity(files: Sequence[str]) -> list[list[Any]]:
    return [[f, os.path.getsize(f), os.stat(f).st_mtime_ns] for f in files]


def _open_local(local: LocalFiles, text_column: str, sample_by: str, what: str) -> _Stream:
    kwargs: dict[str, Any] = {"data_files": {"train": local.files}, "split": "train", "streaming": True}
    column = text_column
    if local.builder == "json":
        kwargs["features"] = _json_features(local, text_column)
    elif local.builder == "text":
        kwargs["sample_by"] = sample_by
        column = "text"  # the text builder always names its column "text"
    elif local.builder == "parquet":
        import pyarrow.parquet as pq

        names = pq.read_schema(local.files[0]).names
        if text_column not in names:
            raise OptBenchError(
                f"text_column {text_column!r} not found in {local.files[0]!r}; columns: {', '.join(names)}. "
                "Set text_column to one of them."
            )
        kwargs["columns"] = [text_column]

    def opener() -> Any:
        import datasets

        return datasets.load_dataset(local.builder, **kwargs)

    desc = f"{what}: {len(local.files)} {local.builder} file(s){' (c4 layout)' if local.c4_layout else ''}"
    identity = {"files": _file_identity(local.files), "builder": local.builder, "sample_by": sample_by}
    return _Stream(opener, column, desc, identity, strip_newlines=local.builder == "text")


def _open_hub(data_args: DataArguments) -> _Stream:
    """The Hub stream; the network is only touched when the data is actually read (not on a cache hit)."""
    name, config, split = data_args.dataset_name, data_args.dataset_config, data_args.dataset_split
    fix = (
        "Fix: download the files (for allenai/c4: multilingual/c4-th.*.json.gz) and use data_source: local with "
        "data_files: <that directory>, or use data_source: thai_sample / synthetic offline."
    )

    def opener() -> Any:
        import datasets

        from hf_optbench.tokenization import _offline_env, hub_reachable

        if _offline_env() or os.environ.get("HF_DATASETS_OFFLINE", "").lower() in {"1", "true", "yes", "on"}:
            raise OptBenchError(f"data_source 'hub' ({name}/{config}) cannot stream while HF_HUB_OFFLINE is set. {fix}")
        if not hub_reachable():
            raise OptBenchError(f"data_source 'hub' ({name}/{config}): the Hugging Face Hub cannot be reached. {fix}")
        kwargs: dict[str, Any] = {"split": split, "streaming": True}
        if name.rstrip("/").split("/")[-1] == "c4":
            kwargs["features"] = datasets.Features({c: datasets.Value("string") for c in _C4_COLUMNS})
        try:
            return datasets.load_dataset(name, config, **kwargs)
        except (OSError, ValueError, ConnectionError) as exc:
            raise OptBenchError(f"cannot open {name} config {config!r} split {split!r}: {exc}. {fix}") from exc

    desc = f"hub: {name}/{config} split {split} (streamed)"
    return _Stream(opener, data_args.text_column, desc, {"hub": [name, config, split]})


def open_source(data_args: DataArguments) -> _Stream:
    """Open the text source of ``data_args`` as a datasets IterableDataset (checks files first)."""
    if data_args.data_source == "thai_sample":
        local = LocalFiles([str(THAI_SAMPLE_FILE)], "json")
        check_local_files(local)
        return _open_local(local, "text", data_args.txt_sample_by, "thai_sample")
    if data_args.data_source == "local":
        local = resolve_local_files(data_args.data_files or [], config=data_args.dataset_config, split=data_args.dataset_split)
        check_local_files(local)
        return _open_local(local, data_args.text_column, data_args.txt_sample_by, "local")
    if data_args.data_source == "hub":
        return _open_hub(data_args)
    raise OptBenchError(f"data_source {data_args.data_source!r} has no text stream (synthetic is generated as ids).")


def iter_texts(stream: _Stream, limit: int | None = None) -> Iterator[str]:
    """Non-empty document texts of ``stream`` in order; a missing or non-text column is a clear error."""
    n = 0
    try:
        it = iter(stream.dataset)
        while True:
            try:
                example = next(it)
            except StopIteration:
                break
            if n == 0 and stream.text_column not in example:
                raise OptBenchError(
                    f"text_column {stream.text_column!r} not found in {stream.description}; columns: "
                    f"{', '.join(example)}. Set text_column to the column that holds the text."
                )
            text = example[stream.text_column]
            if text is None:
                continue
            if not isinstance(text, str):
                raise OptBenchError(
                    f"text_column {stream.text_column!r} holds {type(text).__name__} values, not text, in "
                    f"{stream.description}. Set text_column to a string column."
                )
            if not text.strip():
                continue
            yield text.strip("\r\n") if stream.strip_newlines else text
            n += 1
            if limit is not None and n >= limit:
                break
    except OptBenchError:
        raise
    except Exception as exc:  # pyarrow/json errors surface only while streaming: name the source
        raise OptBenchError(f"could not read {stream.description}: {type(exc).__name__}: {exc}. Check the files.") from exc


def iter_local_documents(
    inputs: Sequence[str], *, text_column: str = "text", sample_by: str = "paragraph", config: str = "th"
) -> Iterator[str]:
    """Texts of local files (used by ``hf-optbench tokenizer train`` and ``data difficulty``)."""
    local = resolve_local_files(inputs, config=config)
    check_local_files(local)
    yield from iter_texts(_open_local(local, text_column, sample_by, "input"))


def iter_documents(data_args: DataArguments, limit: int | None = None) -> Iterator[str]:
    """Texts of the configured text source, first ``limit`` (or ``max_documents``) of them."""
    stream = open_source(data_args)
    yield from iter_texts(stream, limit if limit is not None else data_args.max_documents)


# ------------------------------------------------------------------------------------------------ the split
def is_eval_document(index: int, fraction: float, split_seed: int) -> bool:
    """Systematic sample: document ``index`` is held out when the running count ``floor(i*f + u)`` steps up.

    Exactly ``fraction`` of documents (to within one), spread evenly, with the start ``u`` drawn from
    ``split_seed``; a pure function of the document's position, so every run with the same settings agrees.
    """
    u = random.Random(split_seed).random()
    return math.floor((index + 1) * fraction + u) > math.floor(index * fraction + u)


# ------------------------------------------------------------------------------------------------- pipeline
def _tokenize_batch(batch: dict[str, list[Any]], tokenizer: Any, eos_id: int) -> dict[str, list[list[int]]]:
    ids = tokenizer(batch["text"], add_special_tokens=False, return_attention_mask=False, verbose=False)["input_ids"]
    return {"input_ids": [x + [eos_id] for x in ids]}


def _document_rows(stream: _Stream, data_args: DataArguments, tokenizer: Any, eos_id: int, stats: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Documents in order with their split flag; in token-budget mode already tokenized (to know when to stop)."""
    budget_mode = data_args.max_train_tokens is not None
    bs = data_args.block_size
    train_need = (data_args.max_train_tokens // bs) * bs if budget_mode else 0
    eval_need = (data_args.validation_blocks or 0) * bs
    counts = {"train": 0, "eval": 0}
    tokens = {"train": 0, "eval": 0}
    pending: list[tuple[str, bool]] = []

    def flush() -> Iterator[dict[str, Any]]:
        enc = _tokenize_batch({"text": [t for t, _ in pending]}, tokenizer, eos_id)["input_ids"]
        for (_, ev), ids in zip(pending, enc, strict=True):
            tokens["eval" if ev else "train"] += len(ids)
            yield {"input_ids": ids, "eval": ev}
        pending.clear()

    for index, text in enumerate(iter_texts(stream, data_args.max_documents)):
        ev = is_eval_document(index, data_args.validation_fraction, data_args.split_seed)
        counts["eval" if ev else "train"] += 1
        if not budget_mode:
            yield {"text": text, "eval": ev}
            continue
        pending.append((text, ev))
        if len(pending) >= _BUDGET_BATCH:
            yield from flush()
            if tokens["train"] >= train_need and tokens["eval"] >= eval_need:
                break
    if pending:
        yield from flush()
    stats["documents"] = counts


def _pack_split(tokenized: Any, want_eval: bool, block_size: int, max_blocks: int | None, path: str, stats: dict[str, Any]) -> None:
    """Concatenate the split's documents and write ``block_size`` blocks to an Arrow stream file.

    Written by hand (pyarrow record batches) rather than through datasets.map: the remainder of each read batch is
    carried into the next one, so no token is lost or duplicated except the final partial block.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = pa.schema([("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int32()))])
    carry = np.empty(0, dtype=np.int32)
    blocks = tokens_in = max_id = 0
    done = False
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for table in tokenized.with_format("arrow").iter(batch_size=_PACK_READ_BATCH):
            mask = pc.equal(table["eval"], want_eval)
            ids = pc.list_flatten(pc.filter(table["input_ids"], mask)).to_numpy(zero_copy_only=False)
            if ids.size == 0:
                continue
            tokens_in += int(ids.size)
            max_id = max(max_id, int(ids.max()))
            buf = np.concatenate([carry, ids])
            n_full = buf.size // block_size
            if max_blocks is not None:
                n_full = min(n_full, max_blocks - blocks)
            if n_full:
                values = pa.array(buf[: n_full * block_size].astype(np.int32, copy=False))
                offsets = pa.array(np.arange(0, (n_full + 1) * block_size, block_size, dtype=np.int32))
                col = pa.ListArray.from_arrays(offsets, values)
                writer.write_batch(pa.record_batch([col, col], schema=schema))
                blocks += n_full
            carry = buf[n_full * block_size :]
            if max_blocks is not None and blocks >= max_blocks:
                done = True
                break
    stats.update(blocks=blocks, tokens=blocks * block_size, max_id=max_id, tokens_read=tokens_in,
                 dropped_tail_tokens=0 if done else int(carry.size))


def _reraise_user_error(exc: BaseException) -> None:
    cause: BaseException | None = exc
    seen = 0
    while cause is not None and seen < 10:
        if isinstance(cause, OptBenchError):
            raise cause
        cause, seen = cause.__cause__ or cause.__context__, seen + 1


def _fingerprint(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _split_settings(data_args: DataArguments) -> dict[str, Any]:
    return {
        "version": PIPELINE_VERSION,
        "block_size": data_args.block_size,
        "validation_fraction": data_args.validation_fraction,
        "validation_blocks": data_args.validation_blocks,
        "split_seed": data_args.split_seed,
    }


def _num_workers(data_args: DataArguments) -> int:
    # Default 1: the Rust tokenizer already spreads a batch over all cores; on 2 shared cores, 2 processes were
    # within run-to-run noise of 1 (benchmarks/bench_data.py).
    return data_args.preprocessing_num_workers or 1


def _load_cached(path: str) -> tuple[Any, dict[str, Any]] | None:
    import datasets

    meta = os.path.join(path, "optbench_data.json")
    if not os.path.isfile(meta):
        return None
    with open(meta, encoding="utf-8") as fh:
        info = json.load(fh)
    return datasets.load_from_disk(path), info


def _store(ddict: Any, info: dict[str, Any], cache_root: str, fp: str) -> str:
    """Save atomically (temp dir + rename) so concurrent ranks never read a half-written cache."""
    final = os.path.join(cache_root, fp)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{fp}-", dir=cache_root)
    ddict.save_to_disk(tmp)
    with open(os.path.join(tmp, "optbench_data.json"), "w", encoding="utf-8") as fh:
        json.dump(info, fh, indent=2, sort_keys=True)
    if os.path.isdir(final):
        shutil.rmtree(final)
    try:
        os.replace(tmp, final)
    except OSError:  # another process won the race: keep its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _bundle_from_cache(cached: tuple[Any, dict[str, Any]], tokenizer: Any, vocab_size: int, hit: bool, path: str) -> DatasetBundle:
    ddict, info = cached
    info = {**info, "cache_hit": hit, "cache_path": path}
    ids = (None, None, None) if tokenizer is None else (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    return DatasetBundle(ddict["train"], ddict["eval"], tokenizer, vocab_size, *ids, info=info)


def prepare_data(data_args: DataArguments, *, n_positions: int) -> DatasetBundle:
    """Load the tokenizer (not for synthetic), read the source, tokenize, pack, split and cache.

    Raises :class:`OptBenchError` for bad input (block_size > n_positions, empty/binary files, a missing text
    column, a validation split larger than the data, token ids outside the tokenizer's vocabulary).
    """
    if data_args.block_size > n_positions:
        raise OptBenchError(
            f"block_size={data_args.block_size} is larger than the model's n_positions={n_positions}. Lower "
            f"block_size to <= {n_positions} or build the model with more positions."
        )
    cache_root = data_args.resolved_cache_dir()
    os.makedirs(cache_root, exist_ok=True)
    if data_args.data_source == "synthetic":
        return _prepare_synthetic(data_args, cache_root)

    from hf_optbench.tokenization import load_tokenizer, tokenizer_fingerprint

    stream = open_source(data_args)  # cheap checks on files before the tokenizer is loaded
    tokenizer = load_tokenizer(data_args.tokenizer_name)
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise OptBenchError(
            f"tokenizer {data_args.tokenizer_name!r} has no eos_token, needed between packed documents. Use a "
            "tokenizer with one (GPT-2 style <|endoftext|>) or train one with `hf-optbench tokenizer train`."
        )
    vocab_size = len(tokenizer)
    payload = {
        **_split_settings(data_args),
        "source": stream.identity,
        "text_column": stream.text_column,
        "max_documents": data_args.max_documents,
        "max_train_tokens": data_args.max_train_tokens,
        "tokenizer": tokenizer_fingerprint(tokenizer),
    }
    fp = _fingerprint(payload)
    final = os.path.join(cache_root, fp)
    if not data_args.overwrite_data_cache:
        cached = _load_cached(final)
        if cached is not None:
            if cached[1].get("vocab_size") != vocab_size:
                raise OptBenchError(
                    f"cached data at {final} was built for vocab_size {cached[1].get('vocab_size')}, tokenizer has "
                    f"{vocab_size}. Set overwrite_data_cache: true to rebuild it."
                )
            return _bundle_from_cache(cached, tokenizer, vocab_size, True, final)

    t0 = time.perf_counter()
    import datasets

    work = tempfile.mkdtemp(prefix=".work-", dir=cache_root)
    try:
        stats: dict[str, Any] = {}
        try:
            docs = datasets.Dataset.from_generator(
                lambda: _document_rows(stream, data_args, tokenizer, eos_id, stats),
                cache_dir=work,
                fingerprint=f"{fp}-docs",
            )
        except Exception as exc:  # datasets wraps errors raised in the generator: surface ours unchanged
            _reraise_user_error(exc)
            raise
        if len(docs) == 0:
            raise OptBenchError(f"{stream.description} holds no non-empty document in column {stream.text_column!r}. Check the input.")
        if "text" in docs.column_names:
            workers = min(_num_workers(data_args), len(docs))
            docs = docs.map(
                _tokenize_batch,
                batched=True,
                batch_size=_TOKENIZE_BATCH,
                num_proc=workers if workers > 1 else None,
                remove_columns=["text"],
                features=datasets.Features({"eval": datasets.Value("bool"),
                                            "input_ids": datasets.List(datasets.Value("int32"))}),
                fn_kwargs={"tokenizer": tokenizer, "eos_id": eos_id},
                new_fingerprint=f"{fp}-tok",
                desc="tokenize",
            )
        bs = data_args.block_size
        max_train = data_args.max_train_tokens // bs if data_args.max_train_tokens else None
        split_stats: dict[str, dict[str, Any]] = {"train": {}, "eval": {}}
        parts = {}
        for name, want_eval, cap in (("train", False, max_train), ("eval", True, data_args.validation_blocks)):
            path = os.path.join(work, f"{name}.arrow")
            _pack_split(docs, want_eval, bs, cap, path, split_stats[name])
            parts[name] = datasets.Dataset.from_file(path)
        _check_split_sizes(data_args, split_stats, stream.description)
        max_id = max(split_stats["train"]["max_id"], split_stats["eval"]["max_id"])
        if max_id >= vocab_size:
            raise OptBenchError(
                f"token id {max_id} is outside the tokenizer's vocabulary (size {vocab_size}): tokenizer/vocabulary "
                "mismatch. Use the tokenizer the data was made with."
            )
        info = {
            "data_source": data_args.data_source,
            "source": stream.description,
            "tokenizer": data_args.tokenizer_name,
            "tokenizer_fingerprint": payload["tokenizer"],
            "vocab_size": vocab_size,
            "block_size": bs,
            "num_documents": stats.get("documents", {}),
            "train_blocks": split_stats["train"]["blocks"],
            "eval_blocks": split_stats["eval"]["blocks"],
            "train_tokens": split_stats["train"]["tokens"],
            "eval_tokens": split_stats["eval"]["tokens"],
            "dropped_tail_tokens": {k: v["dropped_tail_tokens"] for k, v in split_stats.items()},
            "split_seed": data_args.split_seed,
            "fingerprint": fp,
            "build_seconds": round(time.perf_counter() - t0, 3),
        }
        path = _store(datasets.DatasetDict(parts), info, cache_root, fp)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _reload_fresh(path, tokenizer, vocab_size)


def _check_split_sizes(data_args: DataArguments, split_stats: dict[str, dict[str, Any]], what: str) -> None:
    bs = data_args.block_size
    train, ev = split_stats["train"], split_stats["eval"]
    if data_args.validation_blocks is not None and ev["blocks"] < data_args.validation_blocks:
        raise OptBenchError(
            f"validation split larger than the data: validation_blocks={data_args.validation_blocks} but the held-out "
            f"documents of {what} give {ev['blocks']} block(s) of {bs} tokens. Lower validation_blocks or "
            "block_size, raise validation_fraction, or add data."
        )
    if ev["blocks"] == 0:
        raise OptBenchError(
            f"the validation split is empty: the held-out documents of {what} ({ev['tokens_read']} tokens) do not fill "
            f"one block of {bs}. Raise validation_fraction, lower block_size, or add data."
        )
    if train["blocks"] == 0:
        raise OptBenchError(
            f"no training block: {what} gives {train['tokens_read']} training tokens, less than block_size={bs}. "
            "Add data, lower block_size or lower validation_fraction."
        )
    if data_args.max_train_tokens is not None and train["blocks"] < data_args.max_train_tokens // bs:
        raise OptBenchError(
            f"max_train_tokens={data_args.max_train_tokens} but {what} only gives {train['tokens']} training tokens. "
            "Lower max_train_tokens or add data."
        )


def _prepare_synthetic(data_args: DataArguments, cache_root: str) -> DatasetBundle:
    from hf_optbench.synthetic import HMMSource

    bs = data_args.block_size
    n_train = data_args.synthetic_num_tokens // bs
    n_eval = data_args.validation_blocks or max(1, round(data_args.validation_fraction * n_train))
    if n_eval > n_train:
        raise OptBenchError(
            f"validation split larger than the data: {n_eval} validation blocks > {n_train} training blocks. "
            "Lower validation_blocks or raise synthetic_num_tokens."
        )
    knobs = {k: getattr(data_args, k) for k in (
        "synthetic_vocab_size", "synthetic_hidden_nodes", "synthetic_hidden_states", "synthetic_alpha_x",
        "synthetic_alpha_z", "synthetic_num_tokens", "synthetic_seed")}
    fp = _fingerprint({**_split_settings(data_args), "synthetic": knobs, "n_eval": n_eval})
    final = os.path.join(cache_root, fp)
    vocab = data_args.synthetic_vocab_size
    if not data_args.overwrite_data_cache:
        cached = _load_cached(final)
        if cached is not None:
            return _bundle_from_cache(cached, None, vocab, True, final)

    import datasets
    import numpy as np
    import pyarrow as pa

    t0 = time.perf_counter()
    src = HMMSource.from_data_args(data_args)
    schema = pa.schema([("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int32()))])
    work = tempfile.mkdtemp(prefix=".work-", dir=cache_root)
    try:
        parts = {}
        for name, n in (("train", n_train), ("eval", n_eval)):
            path = os.path.join(work, f"{name}.arrow")
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
                for chunk in src.iter_blocks(n, bs, split=name, split_seed=data_args.split_seed):
                    offsets = pa.array(np.arange(0, chunk.size + 1, bs, dtype=np.int32))
                    col = pa.ListArray.from_arrays(offsets, pa.array(chunk.reshape(-1)))
                    writer.write_batch(pa.record_batch([col, col], schema=schema))
            parts[name] = datasets.Dataset.from_file(path)
        info = {
            "data_source": "synthetic",
            "source": f"synthetic: HMM graph V={vocab} K={data_args.synthetic_hidden_nodes} "
            f"S={data_args.synthetic_hidden_states} alpha_x={data_args.synthetic_alpha_x} "
            f"alpha_z={data_args.synthetic_alpha_z} seed={data_args.synthetic_seed}",
            "tokenizer": None,
            "vocab_size": vocab,
            "block_size": bs,
            "num_documents": {"train": n_train, "eval": n_eval},
            "train_blocks": n_train,
            "eval_blocks": n_eval,
            "train_tokens": n_train * bs,
            "eval_tokens": n_eval * bs,
            "dropped_tail_tokens": {"train": 0, "eval": 0},
            "split_seed": data_args.split_seed,
            "fingerprint": fp,
            "build_seconds": round(time.perf_counter() - t0, 3),
        }
        path = _store(datasets.DatasetDict(parts), info, cache_root, fp)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _reload_fresh(path, None, vocab)


def _reload_fresh(path: str, tokenizer: Any, vocab_size: int) -> DatasetBundle:
    """The bundle of a cache entry just written, read back memory-mapped like any later cache hit."""
    cached = _load_cached(path)
    if cached is None:
        raise RuntimeError(f"the data cache entry just written at {path} could not be read back")
    return _bundle_from_cache(cached, tokenizer, vocab_size, False, path)


def check_model_vocab(bundle: DatasetBundle, model_vocab_size: int) -> None:
    """Raise if a model's embedding table cannot hold every id of the data (e.g. ``init_from`` another tokenizer)."""
    if model_vocab_size < bundle.vocab_size:
        raise OptBenchError(
            f"tokenizer/vocabulary mismatch: the data uses {bundle.vocab_size} ids but the model's embedding has "
            f"{model_vocab_size} rows. Build the model with vocab_size >= {bundle.vocab_size} (pad to a multiple of 64)."
        )


build_datasets = prepare_data  # the name used in docs/ARCHITECTURE.md and hf_optbench.__init__
