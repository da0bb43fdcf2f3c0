"""What the data cache's checksums cost: write + verify time on a ~100 MB cache entry vs the time to build it.

    .venv/bin/python benchmarks/bench_cache_verify.py                       # ~100 MB entry, synthetic and text
    .venv/bin/python benchmarks/bench_cache_verify.py --mb 20 --sources synthetic --repeats 3

For each source the entry is built once with ``prepare_data`` (cold: nothing cached; the build includes writing the
checksums), then, on the built files:
- checksum at write: :func:`hf_optbench.data.cache.file_checksums` (what ``store`` adds to a build);
- verify on a hit: :func:`hf_optbench.data.cache.verify_entry` (sizes, then SHA-256 of every file), and
  ``load_cached`` with and without verification (what a cache hit costs a run's start);
- SHA-256 vs BLAKE2b throughput over the same files, interleaved (the reason for the choice of hash).
Each timing is the median of ``--repeats``. The files were just written, so they are read from the page cache:
these are hash costs, not disk reads. A cold read is bounded by the disk, which memory-mapped training would pay
too, page by page, as it touches the data. The synthetic source builds fastest of all sources (no tokenizer), so
its ratio is the upper bound of the relative cost; the text source is the shipped Thai sample's phrases drawn into
~800-character documents in the c4 layout (benchmarks/bench_data.py's corpus), tokenized with builtin:thai-bpe-2k.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BYTES_PER_TOKEN = 8  # input_ids and labels, int32 each (hf_optbench.data.cache.block_schema)
TEXT_BYTES_PER_TOKEN = 8.6  # UTF-8 bytes of the bench corpus per builtin:thai-bpe-2k token (80 MB -> 9.38M tokens)


def _median_s(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _hash_files(files: list[Path], algorithm: str) -> None:
    for path in files:
        with open(path, "rb") as fh:
            hashlib.file_digest(fh, algorithm)


def _build(source: str, mb: float, work: Path) -> tuple[Any, float]:
    """Build the entry (cold) and return (bundle, seconds)."""
    from hf_optbench.config.data_args import DataArguments
    from hf_optbench.data.pipeline import prepare_data

    tokens = int(mb * 1e6 / BYTES_PER_TOKEN)
    common = {"data_cache_dir": str(work / f"cache-{source}"), "block_size": 1024, "validation_blocks": 16}
    if source == "synthetic":
        args = DataArguments(data_source="synthetic", synthetic_num_tokens=tokens, **common)
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_data import build_corpus  # the data benchmark's Thai corpus, so the two read alike

        corpus = work / "corpus"
        build_corpus(corpus, tokens * TEXT_BYTES_PER_TOKEN / 1e6)
        args = DataArguments(data_source="local", data_files=[str(corpus)], tokenizer_name="builtin:thai-bpe-2k",
                             **common)
    t0 = time.perf_counter()
    bundle = prepare_data(args, n_positions=1024)
    return bundle, time.perf_counter() - t0


def measure(source: str, mb: float, repeats: int, work: Path) -> dict[str, Any]:
    """One source's row: entry size, build time, checksum write/verify time and hash throughputs."""
    from hf_optbench.data.cache import INFO_FILE, file_checksums, load_cached, verify_entry

    bundle, build_s = _build(source, mb, work)
    entry = Path(bundle.info["cache_path"])
    del bundle
    files = sorted(p for p in entry.rglob("*") if p.is_file() and p.name != INFO_FILE)
    size = sum(p.stat().st_size for p in files)
    info = load_cached(str(entry), verify=False)[1]
    write_s = _median_s(lambda: file_checksums(str(entry)), repeats)
    verify_s = _median_s(lambda: verify_entry(str(entry), info), repeats)
    hit_plain_s = _median_s(lambda: load_cached(str(entry), verify=False), repeats)
    hit_verified_s = _median_s(lambda: load_cached(str(entry)), repeats)
    per_alg: dict[str, list[float]] = {"sha256": [], "blake2b": []}
    for _ in range(repeats):  # interleaved, so a burst of load from other jobs hits both alike
        for alg, times in per_alg.items():
            t0 = time.perf_counter()
            _hash_files(files, alg)
            times.append(time.perf_counter() - t0)
    return {
        "source": source, "entry_mb": size / 1e6, "build_s": build_s, "write_s": write_s, "verify_s": verify_s,
        "hit_plain_s": hit_plain_s, "hit_verified_s": hit_verified_s,
        **{f"{alg}_gb_s": size / statistics.median(t) / 1e9 for alg, t in per_alg.items()},
    }


def format_rows(rows: list[dict[str, Any]]) -> str:
    head = ("| source | entry MB | build s (cold, incl. checksums) | checksum at write s | % of build | verify on hit s "
            "| % of build | hit s without / with verify | sha256 GB/s | blake2b GB/s |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['source']} | {r['entry_mb']:.1f} | {r['build_s']:.2f} | {r['write_s']:.3f} | "
            f"{100 * r['write_s'] / r['build_s']:.1f}% | {r['verify_s']:.3f} | {100 * r['verify_s'] / r['build_s']:.1f}% | "
            f"{r['hit_plain_s']:.3f} / {r['hit_verified_s']:.3f} | {r['sha256_gb_s']:.2f} | {r['blake2b_gb_s']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=100.0, help="size of the cache entry to build, in MB")
    p.add_argument("--sources", nargs="+", choices=("synthetic", "text"), default=["synthetic", "text"])
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    print(f"# bench_cache_verify: {os.cpu_count()} CPU(s), python {sys.version.split()[0]}, "
          f"median of {a.repeats}, files in the page cache")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for source in a.sources:
            rows.append(measure(source, a.mb, a.repeats, Path(tmp)))
    print(format_rows(rows), flush=True)
    return rows


if __name__ == "__main__":
    main()
