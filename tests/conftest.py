"""Shared test set-up: offline, deterministic, quiet, and small."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """One intra-op thread per test: on a 2-core machine small-tensor ops ran 20-70x slower with 2 threads while
    other processes competed for the cores, and one thread makes timings and reductions repeatable."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU-marked tests are skipped, with the reason, where no CUDA device exists."""
    try:
        import torch

        n_gpu = torch.cuda.device_count()
    except ImportError:  # pragma: no cover
        n_gpu = 0
    for item in items:
        if "gpu" in item.keywords and n_gpu < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (marker: gpu)"))
        if "multi_gpu" in item.keywords and n_gpu < 2:
            item.add_marker(pytest.mark.skip(reason="needs 2+ CUDA GPUs (marker: multi_gpu)"))
