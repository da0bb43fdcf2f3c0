"""``hf-optbench tokenizer {train,stats,list}``: train a tokenizer offline, measure one, list the shipped ones.

Training and loading live in :mod:`hf_optbench.data.tokenizers`, reading the input files in
:mod:`hf_optbench.data.sources`; this module only parses flags and prints.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence

from hf_optbench.cli import ArgumentParser
from hf_optbench.data.sources import expand_data_files, iter_local_documents
from hf_optbench.data.tokenizers import (
    BUILTIN_PREFIX,
    DEFAULT_MIN_FREQUENCY,
    METADATA_FILE,
    builtin_tokenizers,
    load_tokenizer,
    tokens_per_char,
    train_tokenizer,
)


def _build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="hf-optbench tokenizer", description="Train or inspect tokenizers offline.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a byte-level BPE (or char-level) tokenizer from local files")
    t.add_argument("--input", nargs="+", required=True, help="files, globs or a directory (txt, jsonl, json.gz in the c4 layout, parquet)")
    t.add_argument("--vocab_size", type=int, required=True, help="total vocabulary size including special tokens")
    t.add_argument("--output", required=True, help="directory to write (loads with AutoTokenizer.from_pretrained)")
    t.add_argument("--keep_thai_marks", action="store_true", default=True,
                   help="keep Unicode combining marks (Thai vowels/tones) inside letter runs (the default)")
    t.add_argument("--no_keep_thai_marks", dest="keep_thai_marks", action="store_false", help="GPT-2's split instead")
    t.add_argument("--char_level", action="store_true", help="one token per grapheme (code point with --no_keep_thai_marks)")
    t.add_argument("--min_frequency", type=int, default=DEFAULT_MIN_FREQUENCY, help="BPE merge threshold (Flax recipe: 2)")
    t.add_argument("--text_column", default="text", help="text column of json/jsonl/parquet input")
    s = sub.add_parser("stats", help="tokens per (Thai) character of a tokenizer on local files")
    s.add_argument("--tokenizer", required=True, help="Hub id, local directory or builtin:<name>")
    s.add_argument("--input", nargs="+", required=True, help="files, globs or a directory")
    s.add_argument("--text_column", default="text", help="text column of json/jsonl/parquet input")
    sub.add_parser("list", help="list the built-in tokenizers")
    return p


def _sha256_files(files: Sequence[str]) -> dict[str, str]:
    """Short content hashes of the training inputs, recorded in the tokenizer's metadata for provenance."""
    out = {}
    for f in files:
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        out[os.path.basename(f)] = h.hexdigest()[:16]
    return out


def _list() -> int:
    for name, path in builtin_tokenizers().items():
        meta_path = path / METADATA_FILE
        meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
        print(f"{BUILTIN_PREFIX}{name}\t{meta.get('kind', '?')}\tvocab {meta.get('vocab_size', '?')}\t{path}")
    return 0


def _train(args: argparse.Namespace) -> int:
    from hf_optbench.config.checks import check_writable_dir

    check_writable_dir(args.output, "--output")  # before training: a bad --output used to fail after it
    t0 = time.perf_counter()
    files = expand_data_files(args.input)
    tok = train_tokenizer(
        iter_local_documents(args.input, text_column=args.text_column),
        args.vocab_size,
        args.output,
        keep_thai_marks=args.keep_thai_marks,
        char_level=args.char_level,
        min_frequency=args.min_frequency,
        metadata={"input_files_sha256": _sha256_files(files)},
    )
    print(f"saved {'char-level' if args.char_level else 'byte-level BPE'} tokenizer (vocab {len(tok)}) to {args.output} "
          f"in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``hf-optbench tokenizer {train,stats,list} ...``."""
    args = _build_parser().parse_args(argv)
    if args.command == "list":
        return _list()
    if args.command == "stats":
        tok = load_tokenizer(args.tokenizer)
        texts = list(iter_local_documents(args.input, text_column=args.text_column))
        print(json.dumps({"tokenizer": args.tokenizer, **tokens_per_char(tok, texts)}, indent=2))
        return 0
    return _train(args)


if __name__ == "__main__":
    sys.exit(main())
