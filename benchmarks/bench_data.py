"""Tokenize + pack throughput (tokens/s) and peak RSS of ``prepare_data`` as the corpus grows 10x.

    .venv/bin/python benchmarks/bench_data.py                  # 1x = 8 MB of Thai text in the c4 layout, and 10x
    .venv/bin/python benchmarks/bench_data.py --mb 2 --workers 1 2

Each measurement runs in a fresh subprocess (clean peak RSS, cold cache). The corpus is built from the shipped Thai
sample by drawing its space-separated phrases at random (seeded) into ~800-character documents, written as
``multilingual/c4-th.*.json.gz`` so the c4-layout path is the one measured. Tokenizer: builtin:thai-bpe-2k.
Peak RSS is ``ru_maxrss`` of the run's main process (with several workers, the largest worker's peak too). It
counts resident pages of memory-mapped Arrow files, which grow with the data and are reclaimable page cache, so
the peak of anonymous memory (``RssAnon``, sampled every 20 ms from /proc/self/status) is reported as well.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

DOC_CHARS = 800
DOCS_PER_FILE = 5000


def build_corpus(root: Path, megabytes: float, seed: int = 0) -> int:
    """Write about ``megabytes`` MB (UTF-8) of Thai documents in the c4 layout; returns the document count."""
    from hf_optbench.data.sources import THAI_SAMPLE_FILE

    phrases = []
    for line in THAI_SAMPLE_FILE.read_text(encoding="utf-8").splitlines():
        phrases += json.loads(line)["text"].split()
    rng = random.Random(seed)
    target = int(megabytes * 1e6)
    (root / "multilingual").mkdir(parents=True, exist_ok=True)
    written = n_docs = shard = 0
    while written < target:
        path = root / "multilingual" / f"c4-th.tfrecord-{shard:05d}-of-99999.json.gz"
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            for _ in range(DOCS_PER_FILE):
                words, size = [], 0
                while size < DOC_CHARS:
                    w = rng.choice(phrases)
                    words.append(w)
                    size += len(w) + 1
                text = " ".join(words)
                fh.write(json.dumps({"text": text, "timestamp": "2020-01-01T00:00:00Z", "url": f"u{n_docs}"}, ensure_ascii=False) + "\n")
                written += len(text.encode("utf-8"))
                n_docs += 1
                if written >= target:
                    break
        shard += 1
    return n_docs


class _AnonPeak(threading.Thread):
    """Sample RssAnon (kB) of this process until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_kb = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            with open("/proc/self/status") as fh:
                for line in fh:
                    if line.startswith("RssAnon:"):
                        self.peak_kb = max(self.peak_kb, int(line.split()[1]))
            time.sleep(0.02)

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return self.peak_kb


def child(corpus: str, cache: str, workers: int) -> None:
    """One measurement (runs in its own process); prints a JSON line."""
    import datasets  # noqa: F401  (imports are not what is measured: a run pays them anyway)
    import torch  # noqa: F401
    import transformers  # noqa: F401

    from hf_optbench.config.data_args import DataArguments
    from hf_optbench.data.pipeline import prepare_data

    args = DataArguments(
        data_source="local", data_files=[corpus], tokenizer_name="builtin:thai-bpe-2k", block_size=128,
        data_cache_dir=cache, preprocessing_num_workers=workers,
    )
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sampler = _AnonPeak()
    sampler.start()
    t0 = time.perf_counter()
    bundle = prepare_data(args, n_positions=1024)
    dt = time.perf_counter() - t0
    anon_peak = sampler.stop()
    info = bundle.info
    tokens = info["train_tokens"] + info["eval_tokens"] + sum(info["dropped_tail_tokens"].values())
    print(json.dumps({
        "workers": workers, "seconds": round(dt, 2), "tokens": tokens, "tokens_per_s": round(tokens / dt),
        "documents": sum(info["num_documents"].values()),
        "rss_after_imports_mb": round(rss_before / 1024, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_anon_mb": round(anon_peak / 1024, 1),
        "peak_worker_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
    }))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=8.0, help="size of the 1x corpus in MB of UTF-8 text")
    p.add_argument("--scales", type=int, nargs="+", default=[1, 10])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--child", nargs=3, metavar=("CORPUS", "CACHE", "WORKERS"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.child[0], a.child[1], int(a.child[2]))
        return
    print(f"# bench_data: {os.cpu_count()} CPU(s), python {sys.version.split()[0]}")
    print("| corpus | MB | docs | workers | tokens | seconds | tokens/s | peak RSS MB (main / worker) | peak anon MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for scale in a.scales:
            corpus = Path(tmp) / f"corpus{scale}x"
            n_docs = build_corpus(corpus, a.mb * scale)
            for w in a.workers:
                cache = Path(tmp) / f"cache-{scale}-{w}"
                out = subprocess.run([sys.executable, __file__, "--child", str(corpus), str(cache), str(w)],
                                     capture_output=True, text=True, check=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                worker = f"{r['peak_worker_rss_mb']}" if w > 1 else "-"
                print(f"| {scale}x | {a.mb * scale:g} | {n_docs} | {w} | {r['tokens']} | {r['seconds']} | "
                      f"{r['tokens_per_s']} | {r['peak_rss_mb']} / {worker} | {r['peak_anon_mb']} |", flush=True)


if __name__ == "__main__":
    main()
