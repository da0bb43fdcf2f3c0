"""Source -> tokenize -> pack into blocks -> fixed train/eval split -> memory-mapped cache: :func:`prepare_data`.

Where documents come from is :mod:`hf_optbench.data.sources`; how the result is keyed and stored (and verified)
is :mod:`hf_optbench.data.cache`; which document goes to which split is :mod:`hf_optbench.data.split`. This module
holds the steps that decide which token lands in which block:
- Split. Documents, not blocks, are held out for eval (and, with ``tuning_blocks``, for learning-rate tuning);
  with ``validation_blocks`` set the eval set stays identical as the training budget grows.
- Packing. ``run_clm``'s group_texts drops every map batch's remainder; we carry it over (by hand: datasets.map is
  stateless across batches) so only the final partial block of each split is dropped.
The names of the two sibling modules that callers used to import from here are re-exported (see ``__all__``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hf_optbench.config.bounds import check_cache_room, could_be_cached
from hf_optbench.config.data_args import DataArguments
from hf_optbench.data import tokenizers
from hf_optbench.data.cache import (
    block_schema,
    fingerprint,
    load_cached,
    lookup,
    make_cache_root,
    progress_bars_on_tty,
    store,
    work_dir,
    write_blocks,
)
from hf_optbench.data.sources import (
    TextStream,
    iter_texts,
    open_source,
)
from hf_optbench.data.split import SPLITS, check_split_sizes, document_split, text_file_hint
from hf_optbench.errors import OptBenchError
from hf_optbench.models import check_block_size

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedTokenizerBase


PIPELINE_VERSION = 2  # bump when the packing/split/cache layout changes: it is part of every cache key (2: checksums, tuning split)
_TOKENIZE_BATCH = 1000
_BUDGET_BATCH = 256
_PACK_READ_BATCH = 2048


@dataclass
class DatasetBundle:
    """What a run needs from the data side. ``train``/``eval``/``tuning`` hold ``input_ids`` and ``labels`` (int32
    lists). ``tuning`` (None unless ``tuning_blocks`` > 0) is held out from both train and eval, for selecting
    learning rates: never report it as the eval loss."""

    train: datasets.Dataset
    eval: datasets.Dataset
    tokenizer: PreTrainedTokenizerBase | None
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    tuning: datasets.Dataset | None = None
    info: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------- pipeline
def _tokenize_batch(batch: dict[str, list[Any]], tokenizer: Any, eos_id: int) -> dict[str, list[list[int]]]:
    ids = tokenizer(batch["text"], add_special_tokens=False, return_attention_mask=False, verbose=False)["input_ids"]
    return {"input_ids": [x + [eos_id] for x in ids]}


def _document_rows(stream: TextStream, data_args: DataArguments, tokenizer: Any, eos_id: int, stats: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Documents in order with their split code; in token-budget mode already tokenized (to know when to stop)."""
    budget_mode = data_args.max_train_tokens is not None
    bs = data_args.block_size
    need = {"train": (data_args.max_train_tokens // bs) * bs if budget_mode else 0,
            "eval": (data_args.validation_blocks or 0) * bs, "tuning": data_args.tuning_blocks * bs}
    names = {code: name for name, code in SPLITS.items()}
    counts = dict.fromkeys(SPLITS, 0)
    tokens = dict.fromkeys(SPLITS, 0)
    pending: list[tuple[str, int]] = []

    def flush() -> Iterator[dict[str, Any]]:
        enc = _tokenize_batch({"text": [t for t, _ in pending]}, tokenizer, eos_id)["input_ids"]
        for (_, code), ids in zip(pending, enc, strict=True):
            tokens[names[code]] += len(ids)
            yield {"input_ids": ids, "split": code}
        pending.clear()

    for index, text in enumerate(iter_texts(stream, data_args.max_documents)):
        code = document_split(index, data_args)
        counts[names[code]] += 1
        if not budget_mode:
            yield {"text": text, "split": code}
            continue
        pending.append((text, code))
        if len(pending) >= _BUDGET_BATCH:
            yield from flush()
            if all(tokens[k] >= need[k] for k in need):
                break
    if pending:
        yield from flush()
    stats["documents"] = counts if data_args.tuning_blocks else {k: v for k, v in counts.items() if k != "tuning"}


def _pack_split(tokenized: Any, code: int, block_size: int, max_blocks: int | None, path: str, stats: dict[str, Any]) -> None:
    """Concatenate the split's documents and write ``block_size`` blocks to an Arrow stream file.

    Written by hand (pyarrow record batches) rather than through datasets.map: the remainder of each read batch is
    carried into the next one, so no token is lost or duplicated except the final partial block.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = block_schema()
    carry = np.empty(0, dtype=np.int32)
    blocks = tokens_in = max_id = 0
    done = False
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for table in tokenized.with_format("arrow").iter(batch_size=_PACK_READ_BATCH):
            mask = pc.equal(table["split"], code)
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
                write_blocks(writer, schema, buf[: n_full * block_size], block_size)
                blocks += n_full
            carry = buf[n_full * block_size :]
            if max_blocks is not None and blocks >= max_blocks:
                done = True
                break
    stats.update(blocks=blocks, tokens=blocks * block_size, max_id=max_id, tokens_read=tokens_in,
                 dropped_tail_tokens=0 if done else int(carry.size))


def _reraise_user_error(exc: BaseException) -> None:
    """Raise the OptBenchError in ``exc``'s cause chain, if any (datasets wraps errors raised in generators)."""
    cause: BaseException | None = exc
    seen = 0
    while cause is not None and seen < 10:
        if isinstance(cause, OptBenchError):
            raise cause
        cause, seen = cause.__cause__ or cause.__context__, seen + 1


def _split_settings(data_args: DataArguments) -> dict[str, Any]:
    return {
        "version": PIPELINE_VERSION,
        "block_size": data_args.block_size,
        "validation_fraction": data_args.validation_fraction,
        "validation_blocks": data_args.validation_blocks,
        "tuning_blocks": data_args.tuning_blocks,
        "split_seed": data_args.split_seed,
    }


def _num_workers(data_args: DataArguments) -> int:
    # Default 1: the Rust tokenizer already spreads a batch over all cores; on 2 shared cores, 2 processes were
    # within run-to-run noise of 1 (benchmarks/bench_data.py).
    return data_args.preprocessing_num_workers or 1


def _bundle_from_cache(cached: tuple[Any, dict[str, Any]], tokenizer: Any, vocab_size: int, hit: bool, path: str) -> DatasetBundle:
    ddict, info = cached
    info = {**{k: v for k, v in info.items() if k != "checksums"}, "cache_hit": hit, "cache_path": path}
    ids = (None, None, None) if tokenizer is None else (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    tuning = ddict["tuning"] if "tuning" in ddict else None
    return DatasetBundle(ddict["train"], ddict["eval"], tokenizer, vocab_size, *ids, tuning=tuning, info=info)


def _reload_fresh(path: str, tokenizer: Any, vocab_size: int, rebuilt_because: str | None) -> DatasetBundle:
    """The bundle of a cache entry just written, read back memory-mapped like any later cache hit (its checksums
    were computed from these very files a moment ago, so they are not read twice)."""
    cached = load_cached(path, verify=False)
    if cached is None:
        raise RuntimeError(f"the data cache entry just written at {path} could not be read back")
    bundle = _bundle_from_cache(cached, tokenizer, vocab_size, False, path)
    if rebuilt_because:
        bundle.info["cache_rebuilt_because"] = rebuilt_because
    return bundle


def _rebuild(build: Any, path: str, rebuilt_because: str | None) -> str:
    """Run ``build()`` (progress bars only on a terminal); when it replaces a damaged entry and fails, say that the
    entry was damaged too."""
    try:
        with progress_bars_on_tty():
            return build()
    except OptBenchError as exc:
        if rebuilt_because is None:
            raise
        raise OptBenchError(f"the data cache entry {path} is damaged ({rebuilt_because}) and rebuilding it "
                            f"failed: {exc}") from exc


# ---------------------------------------------------------------------------------------------- text sources
# A split's DatasetInfo.description: what prepare_data read, as JSON after this prefix. It travels with the
# dataset into a Trainer (remove_columns, select and with_format copy it), so the Python API's record names the data
# it was given (measure.recorder), not only "the Trainer's train_dataset".
DESCRIPTION_PREFIX = "hf_optbench data: "


def described_source(dataset: Any) -> dict[str, Any] | None:
    """{"data_source", "source"} of a split :func:`prepare_data` made (read from its description), else None."""
    text = getattr(getattr(dataset, "info", None), "description", None)
    if not isinstance(text, str) or not text.startswith(DESCRIPTION_PREFIX):
        return None
    try:
        found = json.loads(text[len(DESCRIPTION_PREFIX):])
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def prepare_data(data_args: DataArguments, *, n_positions: int) -> DatasetBundle:
    """Load the tokenizer (not for synthetic), read the source, tokenize, pack, split and cache.

    Raises :class:`OptBenchError` for bad input (block_size > n_positions, empty/binary files, a missing text
    column, a validation split larger than the data, token ids outside the tokenizer's vocabulary).
    """
    bundle = _prepare(data_args, n_positions=n_positions)
    text = DESCRIPTION_PREFIX + json.dumps({"data_source": data_args.data_source,
                                            "source": bundle.info.get("source") or data_args.data_source})
    for split in (bundle.train, bundle.eval, bundle.tuning):
        if split is not None:
            split.info.description = text
    return bundle


def _prepare(data_args: DataArguments, *, n_positions: int) -> DatasetBundle:
    check_block_size(data_args.block_size, n_positions)
    cache_root = data_args.resolved_cache_dir()
    make_cache_root(cache_root, from_env=not data_args.data_cache_dir)  # a file there: exit 2 naming the key
    if data_args.data_source == "synthetic":
        return _prepare_synthetic(data_args, cache_root)

    stream = open_source(data_args)  # cheap checks on files before the tokenizer is loaded
    tokenizer = tokenizers.load_tokenizer(data_args.tokenizer_name)
    if tokenizer.eos_token_id is None:
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
        "tokenizer": tokenizers.tokenizer_fingerprint(tokenizer),
    }
    fp = fingerprint(payload)
    final = os.path.join(cache_root, fp)
    cached, damaged = lookup(final, data_args.overwrite_data_cache)
    if cached is None:  # to be built: the splits whose sizes the settings give must fit on the cache's disk
        make_cache_root(cache_root, from_env=not data_args.data_cache_dir, build=True)  # and it must be writable
        check_cache_room(cache_root, text_splits(data_args), data_args.block_size)
    if cached is not None:
        if cached[1].get("vocab_size") != vocab_size:
            raise OptBenchError(
                f"cached data at {final} was built for vocab_size {cached[1].get('vocab_size')}, tokenizer has "
                f"{vocab_size}. Set overwrite_data_cache: true to rebuild it."
            )
        return _bundle_from_cache(cached, tokenizer, vocab_size, True, final)
    path = _rebuild(lambda: _build_text_entry(data_args, stream, tokenizer, payload["tokenizer"], cache_root, fp),
                    final, damaged)
    return _reload_fresh(path, tokenizer, vocab_size, damaged)


def _build_text_entry(
    data_args: DataArguments, stream: TextStream, tokenizer: Any, tok_fp: str, cache_root: str, fp: str
) -> str:
    """Tokenize, split and pack ``stream`` into the cache entry ``fp``; returns its directory."""
    import datasets

    t0 = time.perf_counter()
    vocab_size = len(tokenizer)
    with work_dir(cache_root) as work:
        docs, doc_counts = _tokenized_documents(data_args, stream, tokenizer, work, fp)
        bs = data_args.block_size
        caps = {"train": data_args.max_train_tokens // bs if data_args.max_train_tokens else None,
                "eval": data_args.validation_blocks, "tuning": data_args.tuning_blocks}
        names = ["train", "eval"] + (["tuning"] if data_args.tuning_blocks else [])
        split_stats: dict[str, dict[str, Any]] = {name: {} for name in names}
        parts = {}
        for name in names:
            path = os.path.join(work, f"{name}.arrow")
            _pack_split(docs, SPLITS[name], bs, caps[name], path, split_stats[name])
            parts[name] = datasets.Dataset.from_file(path)
        check_split_sizes(data_args, split_stats, stream.description, doc_counts,
                          text_file_hint(stream.identity, doc_counts))
        max_id = max(st["max_id"] for st in split_stats.values())
        if max_id >= vocab_size:
            raise OptBenchError(
                f"token id {max_id} is outside the tokenizer's vocabulary (size {vocab_size}): tokenizer/vocabulary "
                "mismatch. Use the tokenizer the data was made with."
            )
        info = {
            "data_source": data_args.data_source,
            "source": stream.description,
            "tokenizer": data_args.tokenizer_name,
            "tokenizer_fingerprint": tok_fp,
            "vocab_size": vocab_size,
            "block_size": bs,
            "num_documents": doc_counts,
            "train_blocks": split_stats["train"]["blocks"],
            "eval_blocks": split_stats["eval"]["blocks"],
            "train_tokens": split_stats["train"]["tokens"],
            "eval_tokens": split_stats["eval"]["tokens"],
            "tuning_blocks": split_stats.get("tuning", {}).get("blocks", 0),
            "tuning_tokens": split_stats.get("tuning", {}).get("tokens", 0),
            "dropped_tail_tokens": {k: v["dropped_tail_tokens"] for k, v in split_stats.items()},
            "split_seed": data_args.split_seed,
            "fingerprint": fp,
            "build_seconds": round(time.perf_counter() - t0, 3),
        }
        return store(datasets.DatasetDict(parts), info, cache_root, fp, replace=data_args.overwrite_data_cache)


def _tokenized_documents(
    data_args: DataArguments, stream: TextStream, tokenizer: Any, work: str, fp: str
) -> tuple[Any, dict[str, int]]:
    """The source's documents as a Dataset of (``eval`` flag, ``input_ids``) and the per-split document counts."""
    import datasets

    eos_id = tokenizer.eos_token_id
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
            features=datasets.Features({"split": datasets.Value("int8"),
                                        "input_ids": datasets.List(datasets.Value("int32"))}),
            fn_kwargs={"tokenizer": tokenizer, "eos_id": eos_id},
            new_fingerprint=f"{fp}-tok",
            desc="tokenize",
        )
    return docs, stats.get("documents", {})


# ------------------------------------------------------------------------------------------- sizes up front
@dataclass(frozen=True)
class PlannedSplits:
    """The splits' sizes in blocks as far as the settings say, before any data is read. ``exact``: the source
    makes exactly these (synthetic); otherwise ``train`` is an upper bound and ``eval``/``tuning`` are unknown
    (None). ``basis`` says where the figure comes from, for an error line."""

    train: int
    eval: int | None
    tuning: int | None
    exact: bool
    basis: str


def _synthetic_sizes(data_args: DataArguments) -> tuple[int, int]:
    """(training blocks, eval blocks) the synthetic source generates: whole blocks of its token budget, and the
    eval blocks asked for (or the validation fraction of the training blocks)."""
    n_train = data_args.synthetic_num_tokens // data_args.block_size
    return n_train, data_args.validation_blocks or max(1, round(data_args.validation_fraction * n_train))


def planned_split_sizes(data_args: DataArguments) -> PlannedSplits | None:
    """What the settings alone say of the splits' sizes, so that a batch larger than the training split is refused
    before the data is generated or tokenized: the synthetic source's sizes exactly; a text source read up to
    ``max_train_tokens`` has at most that many whole blocks to train on; otherwise None (a text source's size is
    known once it is tokenized, or from a cache entry once its checksums are verified)."""
    bs = data_args.block_size
    if data_args.data_source == "synthetic":
        n_train, n_eval = _synthetic_sizes(data_args)
        return PlannedSplits(n_train, n_eval, data_args.tuning_blocks, True,
                             f"synthetic_num_tokens {data_args.synthetic_num_tokens:,} / block_size {bs}")
    if data_args.max_train_tokens is not None:
        return PlannedSplits(data_args.max_train_tokens // bs, None, None, False,
                             f"max_train_tokens {data_args.max_train_tokens:,} / block_size {bs}")
    return None


# ------------------------------------------------------------------------------------------- synthetic source
@dataclass(frozen=True)
class SyntheticEntry:
    """The synthetic source's cache entry as the settings decide it: its splits' sizes, fingerprint and path."""

    n_train: int
    n_eval: int
    fingerprint: str
    path: str


def synthetic_entry(data_args: DataArguments, cache_root: str) -> SyntheticEntry:
    """The synthetic source's entry under ``cache_root``, its sizes checked (no more eval blocks than training
    ones). Settings only: nothing is read or generated."""
    n_train, n_eval = _synthetic_sizes(data_args)
    if n_eval > n_train:
        raise OptBenchError(
            f"validation split larger than the data: {n_eval} validation blocks > {n_train} training blocks. "
            "Lower validation_blocks or raise synthetic_num_tokens."
        )
    knobs = {k: getattr(data_args, k) for k in (
        "synthetic_vocab_size", "synthetic_hidden_nodes", "synthetic_hidden_states", "synthetic_alpha_x",
        "synthetic_alpha_z", "synthetic_num_tokens", "synthetic_seed")}
    if data_args.synthetic_topics:  # only when set: the default source keeps its fingerprint (and cache entries)
        knobs.update(synthetic_topics=data_args.synthetic_topics, synthetic_topic_weight=data_args.synthetic_topic_weight)
    fp = fingerprint({**_split_settings(data_args), "synthetic": knobs, "n_eval": n_eval})
    return SyntheticEntry(n_train, n_eval, fp, os.path.join(cache_root, fp))


def _check_synthetic_room(data_args: DataArguments, cache_root: str, entry: SyntheticEntry) -> None:
    """The entry ``entry``, to be built, fits on the disk of ``cache_root`` (config.bounds.check_cache_room)."""
    check_cache_room(cache_root, {"training": (entry.n_train, "synthetic_num_tokens"),
                                  "validation": (entry.n_eval, "validation_blocks" if data_args.validation_blocks else
                                                 "synthetic_num_tokens (validation_fraction of it)"),
                                  "tuning": (data_args.tuning_blocks, "tuning_blocks")}, data_args.block_size)


def text_splits(data_args: DataArguments) -> dict[str, tuple[int, str]]:
    """A text source's splits whose sizes the settings give, {split: (blocks, the setting)}, for the room checks."""
    bs = data_args.block_size
    return {"training": ((data_args.max_train_tokens or 0) // bs, "max_train_tokens"),
            "validation": (data_args.validation_blocks or 0, "validation_blocks"),
            "tuning": (data_args.tuning_blocks, "tuning_blocks")}


def check_text_room(data_args: DataArguments) -> None:
    """Before the tokenizer is loaded (run.preflight, so ``validate --full`` too): a text source whose settings ask
    for an entry larger than the cache's whole disk (``--max_train_tokens 10000000000000``) is refused in the words
    the build uses. Such an entry cannot be cached already, so the tokenizer's fingerprint, which keys the lookup,
    is not needed to know that it would have to be built. An entry that could be there is left to the run."""
    splits = text_splits(data_args)
    cache_root = data_args.resolved_cache_dir()
    if not could_be_cached(cache_root, splits, data_args.block_size):
        check_cache_room(cache_root, splits, data_args.block_size)


def check_synthetic_room(data_args: DataArguments) -> None:
    """Before anything is imported for the data (run.preflight, so ``validate --full`` too): the refusals
    :func:`_prepare_synthetic` makes from the settings alone, in its words: more eval blocks than training ones, and
    an entry that is not cached (or is to be rebuilt, ``overwrite_data_cache``) and cannot be written on the cache's
    disk (``--synthetic_num_tokens 10000000000000``). An entry that is there is left to the run, which verifies it
    (a damaged one is rebuilt and checked then). Reads the filesystem only."""
    cache_root = data_args.resolved_cache_dir()
    entry = synthetic_entry(data_args, cache_root)
    if data_args.overwrite_data_cache or not os.path.isdir(entry.path):
        _check_synthetic_room(data_args, cache_root, entry)


def _prepare_synthetic(data_args: DataArguments, cache_root: str) -> DatasetBundle:
    """The synthetic source's bundle: sizes checked, cache looked up, else generated (no tokenizer involved)."""
    entry = synthetic_entry(data_args, cache_root)
    vocab = data_args.synthetic_vocab_size
    cached, damaged = lookup(entry.path, data_args.overwrite_data_cache)
    if cached is not None:
        return _bundle_from_cache(cached, None, vocab, True, entry.path)
    make_cache_root(cache_root, from_env=not data_args.data_cache_dir, build=True)  # an entry is built: writable
    _check_synthetic_room(data_args, cache_root, entry)
    from hf_optbench.data.synthetic import build_synthetic_entry  # numpy only when the source is synthetic

    path = _rebuild(lambda: build_synthetic_entry(data_args, entry.n_train, entry.n_eval, cache_root,
                                                  entry.fingerprint), entry.path, damaged)
    return _reload_fresh(path, None, vocab, damaged)


def check_model_vocab(bundle: DatasetBundle, model_vocab_size: int) -> None:
    """Raise if a model's embedding table cannot hold every id of the data (e.g. ``init_from`` another tokenizer)."""
    if model_vocab_size < bundle.vocab_size:
        raise OptBenchError(
            f"tokenizer/vocabulary mismatch: the data uses {bundle.vocab_size} ids but the model's embedding has "
            f"{model_vocab_size} rows. Build the model with vocab_size >= {bundle.vocab_size} (pad to a multiple of 64)."
        )


