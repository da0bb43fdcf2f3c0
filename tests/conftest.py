"""Shared test set-up: offline, deterministic, quiet, small, single-threaded, and safe on several cores.

``make test`` runs the suite with pytest-xdist (``-n auto --dist loadscope``); ``make test-fast`` leaves out the
tests marked ``slow`` or ``distributed``. This file keeps that safe and deterministic:

* every process a test starts runs one OpenMP/MKL thread (the environment is set here, before anything spawns),
  like the tests themselves (the autouse fixture below); a test that passes its own value keeps it;
* a test module runs on one worker (its module-scoped fixtures are built once; the README commands build on each
  other in one directory), and the multi-process / DeepSpeed tests all run on one worker, one after another
  (``ONE_WORKER``, scheduled by :func:`pytest_xdist_make_scheduler`);
* the tests listed in ``SLOW`` get the ``slow`` marker here (their files belong to others), so the fast tier
  leaves them out.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# One thread in every subprocess too (runs, sweeps, README commands, launches): measured 2026-11-25, the README
# quickstart at 45.5 s in the suite with 2 threads against 9.8 s with 1 while other processes held the cores, and
# one thread keeps reductions repeatable. Set, not defaulted, like the in-process fixture below (whose value it
# also becomes: torch reads it at import); a test that passes its own environment value keeps that.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"
# The environment's own commands first, as an activated virtual environment has them (the README's commands run
# so). One `ninja` for every process: DeepSpeed builds its CPU shm op with torch.utils.cpp_extension under
# ~/.cache/torch_extensions, and the system's ninja (1.11, MurmurHash) and the environment's (1.13, rapidhash)
# record the build's command under different hashes, so each took the other's build for stale and rebuilt the op
# (about 50 s of both cores each time, measured in the suite).
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])

import pytest  # noqa: E402

# Tests that launch several processes (2 ranks: both cores) or build DeepSpeed's shm op (one build under
# ~/.cache/torch_extensions behind a lock file that other processes wait on): run on one worker, one after
# another, so they never compete with each other for the cores or wait on each other's build. Node ids without
# parameters, or a file for all its tests. A test marked `distributed` that is missing here gets a warning.
# The README's commands are here too: four of them are 2-rank launches. Measured on a 2-core AMD EPYC: its
# DeepSpeed ZeRO-2 command took 10.9 s alone, 15.7 s beside one busy process, and 63 s in the suite when the
# README's module and these tests ran at the same time on the two workers (two 2-rank jobs on two cores).
ONE_WORKER = frozenset({
    "tests/test_readme_commands.py",
    "tests/test_distributed.py",
    "tests/test_zero_planner.py",
    "tests/test_api.py::test_stock_trainer_keeps_lion_and_cosine_under_cpu_zero2",
    "tests/measure/test_recorder.py::test_two_process_gloo_run_sums_state_over_ranks_and_rank0_writes",
    "tests/measure/test_metrics.py::test_deepspeed_zero2_partition_state_and_fp32_master_are_found",
})
ONE_WORKER_SCOPE = "multi-process and DeepSpeed tests"
# Started first, longest first (each over 50 s of a worker in `make test` on the 2-core AMD EPYC), so that no long
# unit is left for the end of the run while the other worker idles.
FIRST = (ONE_WORKER_SCOPE, "tests/test_benchmarks.py", "tests/study/test_slurm_cluster.py",
         "tests/test_checkpoint_resume.py", "tests/test_gpu_check.py")

# Left out of `make test-fast` besides the tests marked slow or distributed in their files: each took over ~3 s
# on 2 shared cores (a subprocess run, a sweep, a statistical rate check). Marked here rather than in their
# files, which other engineers are editing. Node ids without parameters, or a file for all its tests.
SLOW = frozenset({
    "tests/cli/test_bad_inputs.py::test_bad_input_through_the_installed_command",
    "tests/measure/test_speedup_rates.py::test_a_rule_without_intervals_would_fail_the_null_check",
    "tests/measure/test_verdict_rates.py",
    "tests/study/test_protocol.py::test_a_size_the_tuning_could_not_tune_stops_before_the_comparison",
    "tests/study/test_protocol.py::test_runs_are_grouped_for_wandb",
    "tests/report/test_speedup_report.py::test_the_report_has_the_speedup_question_column_budget_and_mde",
    "tests/study/test_sweep.py::test_killed_sweep_resumes_without_duplicates",
    "tests/study/test_tuning_bracket.py::test_the_tiny_model_really_runs_beyond_the_edge",
    "tests/study/test_tuning_bracket.py::test_a_sweep_stopped_mid_extension_continues_exactly",
    "tests/study/test_worker.py::test_a_run_past_the_timeout_is_stopped_and_failed",
    "tests/test_bench_real_memory.py",
    "tests/test_benchmarks.py::test_bench_startup_runs",
    "tests/test_run.py::test_the_gpu_recipe_process_prints_one_line_and_exits_2",
    "tests/test_run_lock.py::test_second_process_is_refused_in_under_2_s_naming_the_holder_and_changing_nothing",
})


def _listed(nodeid: str, names: frozenset[str]) -> bool:
    """Whether ``nodeid`` (parameters ignored) or its file is in ``names``."""
    base = nodeid.split("[", 1)[0]
    return base in names or base.split("::", 1)[0] in names


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """One intra-op thread per test: on a 2-core machine small-tensor ops ran 20-70x slower with 2 threads while
    other processes competed for the cores, and one thread makes timings and reductions repeatable."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.hookimpl(tryfirst=True)  # the slow markers must be on before `-m` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU-marked tests are skipped, with the reason, where no CUDA device exists; the ``SLOW`` tests get the
    ``slow`` marker; a ``distributed`` test missing from ``ONE_WORKER`` gets a warning."""
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
        if _listed(item.nodeid, SLOW):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("distributed") and not _listed(item.nodeid, ONE_WORKER):
            item.warn(pytest.PytestWarning("marked distributed but not in ONE_WORKER of tests/conftest.py: "
                                           "under xdist it may run beside another multi-process test"))


def pytest_collection_finish(session: pytest.Session) -> None:
    """What the suite holds once its tests are collected (torch, transformers, the test modules: ~700,000 objects)
    is frozen out of the garbage collector's reach (``gc.freeze``), as a run freezes its start-up objects for its
    steps (hf_optbench.run.step_cost.start_up_heap_frozen). Each full collection, automatic or a ``gc.collect()``
    in the code under test, scanned them all: 16.2 s of 73 s in a 836-test part of the fast tier, 4.5 s frozen
    (2-core AMD EPYC). Objects the tests create stay collectable."""
    import gc

    gc.collect()
    gc.freeze()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """For ``--dist loadscope`` and plain ``-n N`` (``load``): one unit per test module (classes included) and the
    ``ONE_WORKER`` tests in one unit, started in ``FIRST`` order. Plain ``load`` would split a module over workers
    (its module fixtures built twice, the README commands apart from the directory they build on). Not
    ``--dist loadgroup``: with pytest 9.2 and pytest-xdist 3.8 it ignores xdist_group markers (pytest-xdist
    issue #1386; seen here: a module's tests on both workers)."""
    if config.getvalue("dist") not in ("load", "loadscope"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SuiteScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return ONE_WORKER_SCOPE if _listed(nodeid, ONE_WORKER) else nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node) -> None:
            if not getattr(self, "_first_moved", False):  # the queue is complete at the first assignment
                for scope in reversed(FIRST):
                    if scope in self.workqueue:
                        self.workqueue.move_to_end(scope, last=False)
                self._first_moved = True
            super()._assign_work_unit(node)

    return SuiteScheduling(config, log)


FAST_TIER_BUDGET_S = 5.0  # one test phase in `make test-fast`; slower ones belong in SLOW (or marked slow)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """In the fast tier (``-m "not slow ..."``), name the test phases over ``FAST_TIER_BUDGET_S``: new slow tests
    show up here before they push ``make test-fast`` past its 2 minutes. Informational; nothing fails."""
    if "not slow" not in (config.getoption("markexpr", "") or ""):
        return
    over = sorted(((r.duration, r.when, r.nodeid) for key in ("passed", "failed", "error")
                   for r in terminalreporter.stats.get(key, []) if getattr(r, "duration", 0.0) > FAST_TIER_BUDGET_S),
                  reverse=True)
    if over:
        terminalreporter.write_sep("-", f"{len(over)} fast-tier test phase(s) over {FAST_TIER_BUDGET_S:.0f} s: "
                                        "mark them slow or add them to SLOW in tests/conftest.py")
        for duration, when, nodeid in over:
            terminalreporter.write_line(f"{duration:6.1f} s {when:8s} {nodeid}")
