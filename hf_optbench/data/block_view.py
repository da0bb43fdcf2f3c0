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
"""

from __future__ import annotations

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


class BlockView:
    """Map-style dataset over a packed ``datasets.Dataset``: ``view[i]`` and ``view.__getitems__(indices)`` give
    ``{"input_ids": LongTensor, "labels": LongTensor}`` per block (see the module docstring)."""

    def __init__(self, chunks: dict[str, list[Any]]) -> None:
        import numpy as np

        self._chunks = chunks
        sizes = [len(c) for c in next(iter(chunks.values()))]
        self._starts = np.cumsum([0, *sizes])
        self._len = int(self._starts[-1])

    def __len__(self) -> int:
        return self._len

    def _rows(self, indices: Any) -> dict[str, Any]:
        import numpy as np
        import torch

        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < -self._len or idx.max() >= self._len):
            raise IndexError(f"block index out of range for {self._len} blocks")
        idx = np.where(idx < 0, idx + self._len, idx)
        which = np.searchsorted(self._starts, idx, side="right") - 1
        out = {}
        for name, chunks in self._chunks.items():
            if len(chunks) == 1:
                rows = chunks[0][idx]
            else:
                rows = np.stack([chunks[c][i - self._starts[c]] for c, i in zip(which, idx, strict=True)])
            out[name] = torch.from_numpy(rows.astype(np.int64))
        return out

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {k: v[0] for k, v in self._rows([index]).items()}

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        rows = self._rows(indices)
        return [{k: v[j] for k, v in rows.items()} for j in range(len(indices))]


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
