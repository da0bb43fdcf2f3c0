"""Which document goes to which split (train, eval, tuning), and the checks that a split is usable.

Why documents and not blocks: no document straddles two splits, so a held-out score never rewards memorising text
seen in training. Eval and tuning documents are systematic samples whose starts come from ``split_seed``: the
eval set depends on the data settings only, never on the training seed or the optimizer, and it is the same with
or without a tuning split (tuning documents are drawn from the non-eval ones, by a second sample with its own
start). The tuning split exists so that learning rates are selected on data that is neither trained on nor
reported as the eval loss (selecting and reporting on one split biases the reported loss downward).
"""

from __future__ import annotations

import functools
import math
import random
from typing import Any

from hf_optbench.config.data_args import DataArguments
from hf_optbench.errors import OptBenchError

TRAIN, EVAL, TUNING = 0, 1, 2  # the ``split`` column of the tokenized documents
SPLITS = {"train": TRAIN, "eval": EVAL, "tuning": TUNING}


@functools.lru_cache(maxsize=64)
def _start(key: int | str) -> float:
    return random.Random(key).random()


def _systematic(index: int, fraction: float, u: float) -> bool:
    return math.floor((index + 1) * fraction + u) > math.floor(index * fraction + u)


def is_eval_document(index: int, fraction: float, split_seed: int) -> bool:
    """Systematic sample: document ``index`` is held out when the running count ``floor(i*f + u)`` steps up.

    Exactly ``fraction`` of documents (to within one), spread evenly, with the start ``u`` drawn from
    ``split_seed``; a pure function of the document's position, so every run with the same settings agrees.
    """
    return _systematic(index, fraction, _start(split_seed))


def is_tuning_document(index: int, fraction: float, split_seed: int) -> bool:
    """A non-eval document picked by a second systematic sample (start drawn from ``"tuning-<split_seed>"``)."""
    return not is_eval_document(index, fraction, split_seed) and _systematic(index, fraction, _start(f"tuning-{split_seed}"))


def document_split(index: int, data_args: DataArguments) -> int:
    """TRAIN, EVAL or TUNING for document ``index`` (no tuning documents when ``tuning_blocks`` is 0)."""
    f, seed = data_args.validation_fraction, data_args.split_seed
    if is_eval_document(index, f, seed):
        return EVAL
    if data_args.tuning_blocks and is_tuning_document(index, f, seed):
        return TUNING
    return TRAIN


def text_file_hint(identity: dict[str, Any], documents: dict[str, int]) -> str:
    """For .txt sources not read line by line: the sentence that names ``--txt_sample_by`` (else empty)."""
    sample_by = identity.get("sample_by")
    if identity.get("builder") != "text" or sample_by == "line":
        return ""
    return (
        f" The .txt file(s) are read with txt_sample_by={sample_by}, which gives {sum(documents.values())} "
        "document(s), and documents are held out whole: pass --txt_sample_by line to make each line a document."
    )


def check_split_sizes(
    data_args: DataArguments, stats: dict[str, dict[str, Any]], what: str, documents: dict[str, int], hint: str = ""
) -> None:
    """Refuse a split the run cannot use (empty, or smaller than asked), naming the cause and the setting to change."""
    bs = data_args.block_size
    train, ev, tu = stats["train"], stats["eval"], stats.get("tuning", {"blocks": 0, "tokens_read": 0})
    docs = f"{documents.get('train', 0)} training, {documents.get('eval', 0)} held-out document(s)"
    total = train["tokens_read"] + ev["tokens_read"] + tu["tokens_read"]
    if total < bs:
        raise OptBenchError(
            f"block_size={bs} is larger than all of {what} ({total} tokens). Lower block_size or add data.{hint}"
        )
    if data_args.validation_blocks is not None and ev["blocks"] < data_args.validation_blocks:
        raise OptBenchError(
            f"validation split larger than the data: validation_blocks={data_args.validation_blocks} but the held-out "
            f"documents of {what} give {ev['blocks']} block(s) of {bs} tokens. Lower validation_blocks or "
            f"block_size, raise validation_fraction, or add data.{hint}"
        )
    if ev["blocks"] == 0:
        raise OptBenchError(
            f"the validation split is empty: the held-out documents of {what} ({ev['tokens_read']} tokens; {docs}) do "
            f"not fill one block of {bs}. Raise validation_fraction, lower block_size, or add data.{hint}"
        )
    if data_args.tuning_blocks and tu["blocks"] < data_args.tuning_blocks:
        raise OptBenchError(
            f"tuning split larger than the data: tuning_blocks={data_args.tuning_blocks} but the tuning documents of "
            f"{what} give {tu['blocks']} block(s) of {bs} tokens. Lower tuning_blocks or block_size, raise "
            f"validation_fraction (it also sets the share of tuning documents), or add data.{hint}"
        )
    if train["blocks"] == 0:
        raise OptBenchError(
            f"no training block: {what} gives {train['tokens_read']} training tokens ({docs}), less than "
            f"block_size={bs}. Add data, lower block_size or lower validation_fraction.{hint}"
        )
    if data_args.max_train_tokens is not None and train["blocks"] < data_args.max_train_tokens // bs:
        raise OptBenchError(
            f"max_train_tokens={data_args.max_train_tokens} but {what} only gives {train['tokens']} training tokens. "
            "Lower max_train_tokens or add data."
        )
