"""config.bounds: every size is refused only when the machine certainly cannot hold it, and the figures the refusal
rests on are lower bounds of what the code really holds (measured here with tracemalloc, so a change to the
synthetic source that makes the formula overstate fails this test)."""

from __future__ import annotations

import tracemalloc
from collections import namedtuple

import numpy as np
import pytest

from hf_optbench.config import bounds
from hf_optbench.config.bounds import (
    MAX_STEPS,
    check_cache_room,
    check_max_steps,
    check_run_bounds,
    check_synthetic_memory,
    steps_memory_bytes,
    synthetic_memory_terms,
)
from hf_optbench.data.synthetic import HMMSource
from hf_optbench.errors import OptBenchError
from hf_optbench.machine import Room

GIB = 2**30
ROOM = Room(4 * GIB, "this machine has {} GiB available")
DEFAULT_GRAPH = {"synthetic_vocab_size": 32, "synthetic_hidden_nodes": 4, "synthetic_hidden_states": 4,
                 "synthetic_topics": 0}


def test_max_steps_past_the_checkpoint_names_room_is_refused_whatever_the_memory() -> None:
    with pytest.raises(OptBenchError, match="at most 999,999,999,999"):
        check_max_steps(10**14, 1, Room(2**62, "{}"))
    check_max_steps(MAX_STEPS, 10**9, Room(2**62, "{}"))


def test_max_steps_whose_records_cannot_fit_is_refused_naming_both_figures_and_what_fits() -> None:
    check_max_steps(10**6, 1, ROOM)  # ~0.7 GB of records: fits in 4 GiB
    with pytest.raises(OptBenchError) as err:
        check_max_steps(10**7, 1, ROOM)
    assert "max_steps 10,000,000" in str(err.value) and "this machine has 4.0 GiB available" in str(err.value)
    fits = int(str(err.value).split("at most ~")[1].split(" ")[0].replace(",", ""))
    assert steps_memory_bytes(fits, 1) <= ROOM.bytes < steps_memory_bytes(fits + 10, 1)
    check_max_steps(10**7, 1000, ROOM)  # logging every 1,000 steps keeps 1,000x fewer log entries


def test_logged_steps_follow_transformers_reading_of_logging_steps() -> None:
    assert bounds.logged_steps(1000, 1) == 1000
    assert bounds.logged_steps(1000, 10) == 100
    assert bounds.logged_steps(1000, 0.1) == 10  # a fraction of the run


@pytest.mark.parametrize("graph", [
    (1024, 4, 4, 0), (1024, 4, 4, 8), (32, 200, 4, 0), (32, 4, 4, 20000), (32, 4, 32, 0), (2048, 0, 4, 0),
], ids=["vocab", "vocab+topics", "hidden-nodes", "topics", "hidden-states", "no-hidden-nodes"])
def test_the_synthetic_figure_is_a_lower_bound_of_what_generation_holds(graph: tuple[int, ...]) -> None:
    """tracemalloc's peak over building the source and sampling one chunk of 512 sequences is at least the formula's
    figure for 512 sequences: a refusal is certain."""
    vocab, nodes, states, topics = graph
    tracemalloc.start()
    try:
        src = HMMSource(vocab_size=vocab, hidden_nodes=nodes, hidden_states=states, topics=topics)
        src.sample(512, 4, np.random.default_rng(0))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    figure = sum(synthetic_memory_terms(vocab, nodes, states, topics, n_sequences=512).values())
    assert figure <= peak, (figure, peak)
    assert figure >= peak / 8  # and not so loose that it says nothing


@pytest.mark.parametrize("key, value, term", [
    ("synthetic_topics", 10**9, "synthetic_topics x synthetic_vocab_size"),
    ("synthetic_hidden_nodes", 10**9, "synthetic_hidden_nodes x synthetic_hidden_states^3"),
    ("synthetic_vocab_size", 65536, "synthetic_vocab_size^2 x synthetic_hidden_states"),
])
def test_a_synthetic_graph_beyond_the_memory_is_refused_naming_its_largest_table(key: str, value: int,
                                                                                   term: str) -> None:
    check_synthetic_memory(DEFAULT_GRAPH, ROOM)
    with pytest.raises(OptBenchError) as err:
        check_synthetic_memory({**DEFAULT_GRAPH, key: value}, ROOM)
    assert f"{key} {value:,}" in str(err.value) and f"tables of {term} numbers" in str(err.value)


def test_run_bounds_read_only_values_of_the_right_type(monkeypatch) -> None:
    monkeypatch.setattr(bounds, "cpu_memory_room", lambda: ROOM)
    check_run_bounds({"max_steps": "10**14", "logging_steps": 1})  # not an int: the parser says so
    check_run_bounds({"data_source": "thai_sample", **DEFAULT_GRAPH, "synthetic_topics": 10**9})  # not synthetic
    with pytest.raises(OptBenchError, match="synthetic_topics 1,000,000,000"):
        check_run_bounds({"data_source": "synthetic", **DEFAULT_GRAPH, "synthetic_topics": 10**9})
    with pytest.raises(OptBenchError, match="max_steps"):
        check_run_bounds({"max_steps": 10**14, "logging_steps": 1})


def test_a_cache_entry_beyond_the_disk_is_refused_naming_the_setting(tmp_path, monkeypatch) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(bounds.shutil, "disk_usage", lambda path: usage(0, 0, 10 * GIB))
    splits = {"training": (8192, "synthetic_num_tokens"), "validation": (819, "validation_blocks"),
              "tuning": (10**12, "tuning_blocks")}
    with pytest.raises(OptBenchError) as err:
        check_cache_room(str(tmp_path / "cache" / "data"), splits, 128)
    text = str(err.value)
    assert "1,000,000,000,000 tuning blocks of 128 tokens" in text and "Lower tuning_blocks" in text
    assert f"the filesystem of '{tmp_path}' has 10.0 GiB free" in text  # the nearest existing directory's
    check_cache_room(str(tmp_path), {**splits, "tuning": (16, "tuning_blocks")}, 128)


def test_small_figures_keep_their_digits() -> None:
    """"at least 0.0 GiB ... has 0.0 GiB free" hid both numbers."""
    from hf_optbench.config.bounds import _gib

    assert (_gib(3 * 2**20), _gib(300 * 2**20), _gib(10 * 2**30), _gib(0)) == ("0.0029", "0.29", "10.0", "0.0")
