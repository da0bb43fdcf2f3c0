"""Where documents come from: local files (txt, jsonl/json[.gz] incl. the c4 layout, parquet), the Hub, the Thai sample.

Why one reader for all of them: the Hub (``allenai/c4`` config ``th`` streamed: mC4 Thai, since ``mc4`` is a
loading script that datasets >= 4 refuses) and a local copy in the c4 layout go through the same ``json`` builder
with the same explicit features (its ``timestamp`` column is auto-parsed otherwise and one odd value raises), then
the same :func:`iter_texts`, so a local copy yields exactly the documents the Hub would. Every file is checked
(empty, binary, not UTF-8, not JSON) before any loading, with an error that names the file and the fix.
A source is opened lazily (:class:`TextStream`): its identity, which keys the data cache, is known without reading
the data, so a cache hit never touches the network or the files' contents.
"""

from __future__ import annotations

import codecs
import glob
import gzip
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_optbench.config.data_args import DataArguments
from hf_optbench.data import tokenizers
from hf_optbench.errors import OptBenchError, suggest

THAI_SAMPLE_FILE = Path(__file__).resolve().parents[1] / "resources" / "thai" / "thai_sample.jsonl"
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
# The longest document (a line of a .txt file read per line, a JSON record's text, a whole file read per document)
# a source may hold. Why: the Rust tokenizer holds ~240-350 bytes of memory per character of one document while it
# encodes it (builtin:thai-bpe-2k measured on one document of 2 and 20 million characters, Thai and ASCII: peaks of
# 0.55-0.67 GB and 4.6-5.4 GB), so a 200 MB line needs ~50-70 GB and aborts the run. 4 Mi characters stays under
# ~1.5 GB and holds a long novel whole (1-3 million characters); longer text is split into documents by the user,
# who knows where its boundaries are.
MAX_DOCUMENT_CHARS = 4 * 2**20
_TOKENIZER_BYTES_PER_CHAR = 240  # the lower end of the measured range, for the error line's figure


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
            check_parquet_footer(path)
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


def check_parquet_footer(path: str) -> None:
    """A Parquet file's footer (its metadata, at the end) parses, and every column chunk it lists lies inside the
    file. Why: a truncated file keeps its leading magic bytes, and pyarrow's error surfaced as a traceback once the
    data was read; this reads the footer only, not the data."""
    import pyarrow.parquet as pq

    size = os.path.getsize(path)
    try:
        meta = pq.read_metadata(path)
        chunks = [meta.row_group(r).column(c) for r in range(meta.num_row_groups) for c in range(meta.num_columns)]
        ends = [(ch.dictionary_page_offset if ch.has_dictionary_page else ch.data_page_offset)
                + ch.total_compressed_size for ch in chunks]
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ... for a damaged footer
        raise OptBenchError(f"data file {path!r} is a damaged Parquet file ({type(exc).__name__}: "
                            f"{' '.join(str(exc).split())[:160]}): "
                            "cut short or corrupted. Replace it, or leave it out of data_files.") from None
    if ends and max(ends) > size:
        raise OptBenchError(f"data file {path!r} is a damaged Parquet file: its footer lists data up to byte "
                            f"{max(ends):,} of a {size:,}-byte file. Replace it, or leave it out of data_files.")


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
class TextStream:
    """A text source, opened lazily: its identity (for the cache key) is known without touching the data."""

    opener: Callable[[], Any]  # -> datasets.IterableDataset
    text_column: str
    description: str
    identity: dict[str, Any]
    strip_newlines: bool = False  # the text builder leaves a file's final newline on the last paragraph
    files: tuple[str, ...] = ()  # a local source's files, to name the one holding a document too long to encode
    _dataset: Any = None

    @property
    def dataset(self) -> Any:
        """The datasets IterableDataset, opened on first use (a cache hit never opens it)."""
        if self._dataset is None:
            self._dataset = self.opener()
        return self._dataset


def _file_identity(files: Sequence[str]) -> list[list[Any]]:
    return [[f, os.path.getsize(f), os.stat(f).st_mtime_ns] for f in files]


def _open_local(local: LocalFiles, text_column: str, sample_by: str, what: str) -> TextStream:
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
                f"Set text_column to one of them.{suggest(text_column, names)}"
            )
        kwargs["columns"] = [text_column]

    def opener() -> Any:
        import datasets

        return datasets.load_dataset(local.builder, **kwargs)

    desc = f"{what}: {len(local.files)} {local.builder} file(s){' (c4 layout)' if local.c4_layout else ''}"
    identity = {"files": _file_identity(local.files), "builder": local.builder, "sample_by": sample_by}
    return TextStream(opener, column, desc, identity, strip_newlines=local.builder == "text", files=tuple(local.files))


def _open_hub(data_args: DataArguments) -> TextStream:
    """The Hub stream; the network is only touched when the data is actually read (not on a cache hit)."""
    name, config, split = data_args.dataset_name, data_args.dataset_config, data_args.dataset_split
    fix = (
        "Fix: download the files (for allenai/c4: multilingual/c4-th.*.json.gz) and use data_source: local with "
        "data_files: <that directory>, or use data_source: thai_sample / synthetic offline."
    )

    def opener() -> Any:
        import datasets

        if tokenizers.offline_env() or os.environ.get("HF_DATASETS_OFFLINE", "").lower() in {"1", "true", "yes", "on"}:
            raise OptBenchError(f"data_source 'hub' ({name}/{config}) cannot stream while HF_HUB_OFFLINE is set. {fix}")
        if not tokenizers.hub_reachable():  # looked up on the module: one place to stub the network probe
            raise OptBenchError(f"data_source 'hub' ({name}/{config}): the Hugging Face Hub cannot be reached. {fix}")
        kwargs: dict[str, Any] = {"split": split, "streaming": True}
        if name.rstrip("/").split("/")[-1] == "c4":
            kwargs["features"] = datasets.Features({c: datasets.Value("string") for c in _C4_COLUMNS})
        try:
            return datasets.load_dataset(name, config, **kwargs)
        except (OSError, ValueError, ConnectionError) as exc:
            raise OptBenchError(f"cannot open {name} config {config!r} split {split!r}: {exc}. {fix}") from exc

    desc = f"hub: {name}/{config} split {split} (streamed)"
    return TextStream(opener, data_args.text_column, desc, {"hub": [name, config, split]})


def open_source(data_args: DataArguments) -> TextStream:
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


def iter_texts(stream: TextStream, limit: int | None = None) -> Iterator[str]:
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
                    f"{suggest(stream.text_column, example)}"
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
            if len(text) > MAX_DOCUMENT_CHARS:
                raise OptBenchError(_long_document(stream, n, len(text)))
            yield text.strip("\r\n") if stream.strip_newlines else text
            n += 1
            if limit is not None and n >= limit:
                break
    except OptBenchError:
        raise
    except Exception as exc:  # pyarrow/json errors surface only while streaming: name the source
        files = f" ({', '.join(stream.files)})" if 0 < len(stream.files) <= 3 else ""
        raise OptBenchError(f"could not read {stream.description}{files}: {type(exc).__name__}: "
                            f"{' '.join(str(exc).split())[:300].rstrip('.')}. Check the files.") from exc


def _long_line(files: Sequence[str]) -> tuple[str, int] | None:
    """(file, line number) of the first line of ``files`` longer than :data:`MAX_DOCUMENT_CHARS` characters, read
    in 1 MiB chunks (never a whole line at once); None when no line is (a document of another shape)."""
    for path in files:
        opener = gzip.open if path.lower().endswith(".gz") else open
        try:
            with opener(path, "rb") as fh:
                line, chars = 1, 0
                while chunk := fh.read(1 << 20):
                    pieces = chunk.split(b"\n")
                    for i, piece in enumerate(pieces):
                        chars += len(piece.decode("utf-8", "ignore"))  # a character cut at the chunk's end: off by one
                        if chars > MAX_DOCUMENT_CHARS:
                            return path, line
                        if i < len(pieces) - 1:
                            line, chars = line + 1, 0
        except (OSError, EOFError):
            continue
    return None


def _long_document(stream: TextStream, index: int, length: int) -> str:
    """The error line for a document longer than :data:`MAX_DOCUMENT_CHARS`, naming its file and line where the
    source is local files."""
    found = _long_line(stream.files) if stream.files else None
    where = (f"data file '{found[0]}' line {found[1]:,}" if found else
             f"{stream.description} (document {index + 1:,}{', ' + stream.files[0] if len(stream.files) == 1 else ''})")
    need = length * _TOKENIZER_BYTES_PER_CHAR / 2**30
    return (f"{where} holds a document of {length:,} characters, longer than the {MAX_DOCUMENT_CHARS:,} a document "
            f"may have: the tokenizer holds ~{_TOKENIZER_BYTES_PER_CHAR} bytes per character of one document while it "
            f"encodes it (~{need:,.1f} GiB for this one). Split it into shorter documents (lines, or paragraphs with "
            "txt_sample_by paragraph), or leave it out.")


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


