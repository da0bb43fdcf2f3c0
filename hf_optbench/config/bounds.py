"""Every size and count a run is given, bounded before the work it sizes starts: what the plan needs against what
the machine can hold, refused in one line (exit 2) that names the key, both figures and the fix.

Why: unbounded, ``--synthetic_num_tokens 10**13``, ``--synthetic_hidden_nodes 10**9`` and
``--tuning_blocks 10**12`` give no answer for minutes, ``--synthetic_topics 10**9`` ends in a traceback and
``--max_steps 10**14`` is accepted and started: nothing bounds them but the memory or the disk running out. Each
bound below is a lower bound of what the setting costs, worked out from how the code holds it (the arithmetic is
beside each constant), so a refusal is certain: a setting that passes may still not fit, one refused cannot.

- ``max_steps``: at most :data:`MAX_STEPS` (a checkpoint's name holds 12 digits: the room ``output_dir`` is
  checked for, ``config.checks.RUN_DIR_LONGEST_INSIDE``), and the records kept in memory for every step of the
  run (the Trainer's ``log_history``, the probes' series) must fit in the RAM this process can still allocate.
- the synthetic source's graph (``synthetic_vocab_size``, ``synthetic_hidden_nodes``, ``synthetic_hidden_states``,
  ``synthetic_topics``): its transition tables and one chunk of draws must fit in that RAM.
- the data cache entry (``synthetic_num_tokens``, ``validation_blocks``, ``tuning_blocks``, ``max_train_tokens``):
  its blocks, written twice while the entry is built, must fit on the cache directory's disk. Checked by the data
  pipeline once the entry is known to be missing (a cached entry costs nothing).

Standard library only (psutil, for the machine's memory, imported by :func:`hf_optbench.machine.cpu_memory_room`).
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Mapping

from hf_optbench.errors import OptBenchError
from hf_optbench.machine import Room, cpu_memory_room

# A checkpoint is named checkpoint-<step>; the room checked for under output_dir holds 12 digits of steps
# (config.checks.RUN_DIR_LONGEST_INSIDE).
MAX_STEPS = 10**12 - 1
# What a run keeps in memory for every step until it ends: one log_history entry per logged step (the Trainer
# never drops them: {loss, grad_norm, learning_rate, epoch, step}; sys.getsizeof over one entry and its values of a
# tiny run: 588 bytes), and per step a float in probe_timing's step times and two in probe_convergence's loss-area
# series (a list slot of 8 bytes and a float of 24 each).
LOG_ENTRY_BYTES = 588
SERIES_BYTES_PER_STEP = 3 * (8 + 24)
# The synthetic source (data.synthetic): its tables are float64, one numpy array per hidden node (an array object
# is 112 bytes beside its data: sys.getsizeof(np.empty(0))); it samples SYNTHETIC_CHUNK sequences at once, holding
# an int64 state per hidden node and sequence, and for each draw the gathered table rows (float64) and their
# comparison with the uniform draw (bool): 9 bytes per sequence and table entry. Measured with tracemalloc: the
# build peaks at ~6x the tables (Dirichlet draws in log space), so the tables plus the largest one (cumsum's output
# beside its input) is a lower bound.
SYNTHETIC_CHUNK = 4096
FLOAT_BYTES = INDEX_BYTES = 8
ARRAY_OBJECT_BYTES = 112
DRAW_BYTES_PER_ENTRY = FLOAT_BYTES + 1
# A packed block in the data cache: input_ids and labels, int32 each (data.cache.block_schema), so 8 bytes a token;
# an entry is written to a work directory and copied by save_to_disk before it is published (data.cache.store).
CACHE_BYTES_PER_TOKEN = 8
CACHE_COPIES = 2


def _gib(n: float) -> str:
    """GiB to one decimal, or to two significant digits below 1 GiB: a small figure never reads 0.0 beside
    another 0.0 (a refusal that hid both numbers)."""
    gib = n / 2**30
    return f"{gib:,.1f}" if gib >= 0.95 or gib == 0 else f"{gib:.2g}"


def logged_steps(max_steps: int, logging_steps: float) -> int:
    """How many log_history entries a run of ``max_steps`` keeps: one every ``logging_steps`` steps (a value below 1
    is a fraction of the run, as transformers reads it)."""
    if logging_steps <= 0:
        return max_steps
    if logging_steps < 1:
        return math.ceil(1 / logging_steps)
    return math.ceil(max_steps / logging_steps)


def steps_memory_bytes(max_steps: int, logging_steps: float) -> int:
    """Bytes a run of ``max_steps`` keeps in memory for its steps until it ends (at least: see the constants)."""
    return logged_steps(max_steps, logging_steps) * LOG_ENTRY_BYTES + max_steps * SERIES_BYTES_PER_STEP


def check_max_steps(max_steps: int, logging_steps: float, room: Room | None = None) -> None:
    """OptBenchError when ``max_steps`` is past :data:`MAX_STEPS` or its per-step records cannot fit in ``room``
    (default: what this process can still allocate, :func:`hf_optbench.machine.cpu_memory_room`)."""
    if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1:
        return  # config.parse says what a positive step count is
    if max_steps > MAX_STEPS:
        raise OptBenchError(f"max_steps must be at most {MAX_STEPS:,} (a checkpoint's name holds 12 digits of steps), "
                            f"got {max_steps:,}. Set a number of optimizer steps a run can take (e.g. --max_steps "
                            "200).")
    need = steps_memory_bytes(max_steps, logging_steps)
    room = room or cpu_memory_room()
    if need <= room.bytes:
        return
    per_step = steps_memory_bytes(10**6, logging_steps) / 10**6
    raise OptBenchError(
        f"max_steps {max_steps:,} cannot run here: a run keeps a record of every step in memory until it ends "
        f"(transformers' log_history, ~{LOG_ENTRY_BYTES} bytes a logged step, and the probes' series), at least "
        f"{_gib(need)} GiB, and {room.source.format(_gib(room.bytes))}. Lower max_steps (at most "
        f"~{int(room.bytes / per_step):,} here), or raise logging_steps.")


def synthetic_memory_terms(vocab: int, hidden_nodes: int, hidden_states: int, topics: int,
                           n_sequences: int = SYNTHETIC_CHUNK) -> dict[str, int]:
    """{what: bytes} the synthetic source holds while it generates (a lower bound, see the constants): each table
    under the settings that size it, then the largest table once more (its cumsum is made beside it) and one
    chunk's draws."""
    s, v = hidden_states, vocab
    hidden = (s * s + max(hidden_nodes - 1, 0) * s**3) * FLOAT_BYTES if hidden_nodes else 0
    tables = {
        "synthetic_vocab_size^2 x synthetic_hidden_states": v * (s if hidden_nodes else 1) * v * FLOAT_BYTES,
        "synthetic_hidden_nodes x synthetic_hidden_states^3": hidden + hidden_nodes * ARRAY_OBJECT_BYTES
        + n_sequences * hidden_nodes * INDEX_BYTES,
        "synthetic_topics x synthetic_vocab_size": topics * v * FLOAT_BYTES,
    }
    largest = max(tables[k] for k in tables if not k.startswith("synthetic_hidden_nodes"))
    return {**tables, "cumsum": max(largest, s**3 * FLOAT_BYTES if hidden_nodes > 1 else 0),
            "draws": n_sequences * max(v, s) * DRAW_BYTES_PER_ENTRY}


def check_synthetic_memory(values: Mapping[str, int], room: Room | None = None) -> None:
    """OptBenchError when the synthetic source ``values`` (``synthetic_vocab_size``, ``synthetic_hidden_nodes``,
    ``synthetic_hidden_states``, ``synthetic_topics``; ``blocks``: how many sequences it generates, when fewer
    than a chunk) cannot be generated in ``room`` (default: what this process can still allocate), naming the
    settings that cost the most."""
    terms = synthetic_memory_terms(values["synthetic_vocab_size"], values["synthetic_hidden_nodes"],
                                   values["synthetic_hidden_states"], values["synthetic_topics"],
                                   min(SYNTHETIC_CHUNK, max(int(values.get("blocks", SYNTHETIC_CHUNK)), 1)))
    need = sum(terms.values())
    room = room or cpu_memory_room()
    if need <= room.bytes:
        return
    term = max((k for k in terms if k.startswith("synthetic_")), key=lambda k: terms[k])
    graph = ", ".join(f"{k} {values[k]:,}" for k in ("synthetic_vocab_size", "synthetic_hidden_nodes",
                                                     "synthetic_hidden_states", "synthetic_topics"))
    raise OptBenchError(
        f"the synthetic source cannot be generated here ({graph}): it needs at least {_gib(need)} GiB, "
        f"{_gib(terms[term])} GiB of them for the tables of {term} numbers, and "
        f"{room.source.format(_gib(room.bytes))}. Lower those settings (the defaults: a vocabulary of 32, 4 hidden "
        "nodes of 4 states, no topics).")


def _free_bytes(path: str) -> tuple[int, str]:
    """(free bytes, the existing directory they were read from) on the filesystem that will hold ``path``."""
    where = os.path.abspath(path)
    while not os.path.exists(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    return shutil.disk_usage(where).free, where


def could_be_cached(cache_root: str, splits: Mapping[str, tuple[int, str]], block_size: int) -> bool:
    """Whether an entry of ``splits`` fits on the whole filesystem that holds ``cache_root`` at all (one copy of
    :data:`CACHE_BYTES_PER_TOKEN` bytes a token against its total size). An entry that does not cannot be in the
    cache already, whatever it would be keyed by (for a text source, the tokenizer's fingerprint)."""
    once = CACHE_BYTES_PER_TOKEN * block_size * sum(n for n, _ in splits.values())
    return once <= shutil.disk_usage(_free_bytes(cache_root)[1]).total


def check_cache_room(cache_root: str, splits: Mapping[str, tuple[int, str]], block_size: int) -> None:
    """OptBenchError when a data cache entry of ``splits`` ({split: (blocks, the setting that sizes it)}, the part
    known before the data is read) cannot be written under ``cache_root``: :data:`CACHE_COPIES` copies of
    :data:`CACHE_BYTES_PER_TOKEN` bytes a token against the filesystem's free space."""
    need = CACHE_COPIES * CACHE_BYTES_PER_TOKEN * block_size * sum(n for n, _ in splits.values())
    free, where = _free_bytes(cache_root)
    if need <= free:
        return
    setting = max(splits.values())[1]
    listed = ", ".join(f"{n:,} {name}" for name, (n, _) in splits.items() if n)
    raise OptBenchError(
        f"the data cache entry would hold {listed} blocks of {block_size} tokens: at least {_gib(need)} GiB while "
        f"it is built ({CACHE_BYTES_PER_TOKEN} bytes a token, written twice), and the filesystem of '{where}' has "
        f"{_gib(free)} GiB free. Lower {setting}, or set data_cache_dir on a larger disk.")


SYNTHETIC_KEYS = ("synthetic_vocab_size", "synthetic_hidden_nodes", "synthetic_hidden_states", "synthetic_topics")


def check_run_bounds(values: Mapping[str, object]) -> None:
    """The bounds the settings alone decide, from a mapping of the run's values (``max_steps``, ``logging_steps``,
    ``data_source``, the synthetic source's graph, ``synthetic_num_tokens`` and ``block_size``): what
    ``config.parse`` runs on every parsed run and ``run.preflight`` on the command line's values before transformers
    is imported. A value of the wrong type is left to the parser, which says so."""
    steps, logging = values.get("max_steps"), values.get("logging_steps")
    if isinstance(steps, int) and isinstance(logging, (int, float)) and not isinstance(logging, bool):
        check_max_steps(steps, float(logging))
    graph = {k: values.get(k) for k in SYNTHETIC_KEYS}
    if values.get("data_source") == "synthetic" and all(isinstance(v, int) and v >= 0 for v in graph.values()):
        tokens, block = values.get("synthetic_num_tokens"), values.get("block_size")
        blocks = tokens // block if isinstance(tokens, int) and isinstance(block, int) and block > 0 else None
        check_synthetic_memory({**graph, **({"blocks": blocks} if blocks is not None else {})})
