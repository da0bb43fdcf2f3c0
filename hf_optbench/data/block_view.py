"""A packed split as torch tensors read straight from its Arrow columns: what the Trainer's data loader fetches each
step, without turning every block into Python lists and back.

Why: a ``datasets.Dataset`` without a format hands the loader each block as two Python lists of ints, which
``default_data_collator`` turns back into tensors. At the CPU demo's shape (4 blocks of 64 tokens, ~7 ms a step)
that round trip was the largest share of what the Trainer path costs beyond a plain loop
(``benchmarks/bench_step_breakdown.py``). Here each column's int32 values are viewed without a copy as a
(blocks, block_size) array per Arrow chunk (a memory-mapped cache stays on disk), and a batch of indices is gathered
at once and converted to int64 tensors: the very tensors ``default_data_collator`` built from the lists, so the
batches, and the runs, are unchanged (tested bit for bit). Where a split is not plain packed blocks (an indices
mapping after ``select``/``shuffle``, ragged or nullable lists, other columns) it is passed through as it is.
``datasets`` offers ``with_format("torch")``, which still formats block by block; torch's ``Dataset.__getitems__``
is the batched fetch its ``DataLoader`` calls.

A batch leaves ``__getitems__`` ready: one :class:`ReadyBatch` holding the (batch, block_size) tensors, gathered
with one index per column. The loader hands whatever ``__getitems__`` returns to its ``collate_fn``; the collator a
run gives the Trainer (:func:`ready_batches` around ``default_data_collator``) passes a ready batch through and
collates anything else as before. So no step splits the batch into per-block dicts for the collator to stack again
(at the CPU demo's 4 x 64 batch that split and stack cost more than the gather itself). The Trainer's column filter
(``RemoveColumnsCollator``) leaves a ``ReadyBatch`` as it is: it is not a dict, and its columns are exactly
``input_ids`` and ``labels``, arguments of every causal LM's forward.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable
from typing import Any

COLUMNS = ("input_ids", "labels")  # the packed splits' schema (data.cache.block_schema)


def _blocks(column: Any) -> list[Any] | None:
    """The column's chunks as (n, block) int32 numpy views, or None where it is not fixed-length int32 lists."""
    import numpy as np
    import pyarrow as pa

    out, width = [], None
    for chunk in column.chunks:
        if not pa.types.is_list(chunk.type) or chunk.type.value_type != pa.int32() or chunk.null_count:
            return None
        lengths = np.diff(chunk.offsets.to_numpy())
        if len(chunk) == 0:
            continue
        if lengths.min() != lengths.max() or (width is not None and lengths[0] != width):
            return None
        width = int(lengths[0])
        values = chunk.flatten()
        if values.null_count:
            return None
        out.append(values.to_numpy(zero_copy_only=True).reshape(len(chunk), width))
    return out


class ReadyBatch:
    """A batch :meth:`BlockView.__getitems__` gathered already: ``tensors`` is what ``default_data_collator`` would
    have built from its blocks ({column: (batch, block_size) int64 tensor}). Not a dict on purpose: a collator that
    does not know it fails loudly instead of stacking it into a batch of one."""

    __slots__ = ("tensors",)

    def __init__(self, tensors: dict[str, Any]) -> None:
        self.tensors = tensors


class ReadyBatchCollator:
    """``collator`` for a list of examples; a loader's one :class:`ReadyBatch` (what :class:`BlockView` hands over)
    is passed through as its tensors, with no per-step work. Picklable, for loader workers."""

    def __init__(self, collator: Callable[[list[Any]], Any]) -> None:
        self.collator = collator

    def __call__(self, features: list[Any]) -> Any:
        if len(features) == 1 and isinstance(features[0], ReadyBatch):
            return features[0].tensors
        return self.collator(features)


def ready_batches(collator: Callable[[list[Any]], Any]) -> ReadyBatchCollator:
    """The collator a Trainer over a :func:`block_view` split is given: ``collator`` (the run's
    ``default_data_collator``) with :class:`ReadyBatch` passed through."""
    return collator if isinstance(collator, ReadyBatchCollator) else ReadyBatchCollator(collator)


class BlockView:
    """Map-style dataset over a packed ``datasets.Dataset``: ``view[i]`` gives ``{"input_ids": LongTensor,
    "labels": LongTensor}`` for one block, ``view.__getitems__(indices)`` one :class:`ReadyBatch` of those blocks
    (see the module docstring)."""

    def __init__(self, chunks: dict[str, list[Any]]) -> None:
        self._chunks = chunks
        sizes = [len(c) for c in next(iter(chunks.values()))]
        self._starts = [0]
        for size in sizes:
            self._starts.append(self._starts[-1] + size)
        self._len = self._starts[-1]
        self._width = int(next(iter(chunks.values()))[0].shape[1]) if sizes else 0

    def __len__(self) -> int:
        return self._len

    def _rows(self, indices: Any) -> dict[str, Any]:
        """{column: (len(indices), block) int64 tensor}, each block copied once from its chunk into the batch. The
        index arithmetic is plain Python: for a batch of a few blocks numpy's per-call cost would exceed the work."""
        import numpy as np
        import torch

        where = []
        for index in indices:
            i = operator.index(index)
            if not -self._len <= i < self._len:
                raise IndexError(f"block index {i} out of range for {self._len} blocks")
            i += self._len if i < 0 else 0
            c = bisect.bisect_right(self._starts, i) - 1
            where.append((c, i - self._starts[c]))
        out = {}
        for name, chunks in self._chunks.items():
            rows = np.empty((len(where), self._width), dtype=np.int64)
            for j, (c, i) in enumerate(where):
                rows[j] = chunks[c][i]  # int32 to int64 as it copies
            out[name] = torch.from_numpy(rows)
        return out

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {k: v[0] for k, v in self._rows([index]).items()}

    def __getitems__(self, indices: list[int]) -> list[ReadyBatch]:
        """The blocks at ``indices`` as one batch (torch's DataLoader calls this with a batch's indices and hands the
        list to its ``collate_fn``)."""
        return [ReadyBatch(self._rows(indices))]


def block_view(dataset: Any) -> Any:
    """``dataset`` as a :class:`BlockView` where it is a plain packed split (exactly ``input_ids`` and ``labels``,
    fixed-length int32 lists, no indices mapping, no format), else ``dataset`` itself."""
    try:
        import datasets
    except ImportError:  # pragma: no cover - a required dependency
        return dataset
    if not isinstance(dataset, datasets.Dataset) or dataset._indices is not None or dataset.format.get("type"):
        return dataset
    if sorted(dataset.column_names) != sorted(COLUMNS) or len(dataset) == 0:
        return dataset
    table = dataset.data.table
    chunks = {name: _blocks(table.column(name)) for name in COLUMNS}
    if any(c is None for c in chunks.values()):
        return dataset
    widths = {c.shape[1] for cs in chunks.values() for c in cs}
    if len(widths) != 1 or [len(c) for c in chunks["input_ids"]] != [len(c) for c in chunks["labels"]]:
        return dataset
    return BlockView(chunks)
