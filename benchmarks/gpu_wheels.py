"""Wheels that ``benchmarks/gpu_check.sh`` needs on a GPU machine that reaches no package registry.

The lent GPU machine's image (Python 3.12, torch 2.11 + CUDA 13, transformers 5.17, accelerate, huggingface_hub,
tokenizers, safetensors, numpy, scipy, pandas, pyarrow, matplotlib, pytest, pytest-xdist) lacks datasets,
evaluate, lion-pytorch, pytorch-optimizer, schedulefree, bitsandbytes and deepspeed, and its transformers is
older than this project's floor (5.20: ``TrainerCallback.on_optimizer_step``, ``optimization.Adafactor``).
Everything travels inside the working tree, at most 64 MiB with the project, so:

* pure-Python wheels are downloaded for CPython 3.12 manylinux x86-64, at the versions this suite runs with
  (``WHEELS``);
* bitsandbytes' wheel carries a native library per CUDA and ROCm version (129 MB unpacked, 43 MB zipped); it is
  rewritten with only the CUDA 13.0 library that torch 2.11+cu130 loads (plus the CPU one), and its RECORD with
  it, a 4 MB wheel;
* deepspeed publishes no wheel: it is built here from its sdist with ``DS_BUILD_OPS=0`` (pure Python; its CUDA
  ops are JIT-built on first use, and ZeRO with a client optimizer needs none).

    python benchmarks/gpu_wheels.py [--dest .whl]      # or: make gpu-wheels

On the GPU machine: ``python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl`` and
``PYTHONPATH=/tmp/site`` (``gpu_check.sh`` does both when it finds ``.whl/``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# name==version: the versions `make setup` installs here (constraints: torch 2.13 CPU), each checked against the
# image's torch 2.11 / huggingface_hub 1.33 / tokenizers 0.23 by its Requires-Dist.
WHEELS = (
    "transformers==5.24.0",  # tokenizers<0.24,>=0.23.1 and huggingface-hub>=1.31: the image's 0.23.2 / 1.33 fit
    "datasets==5.2.0",
    "dill==0.4.1",  # datasets: dill<0.4.2
    "multiprocess==0.70.19",  # datasets: multiprocess<0.70.20
    "fsspec==2026.9.0",  # datasets: fsspec<=2026.9.0 (the image's may be newer)
    "evaluate==0.4.6",
    "lion-pytorch==0.2.5",
    "schedulefree==1.4.1",
    "pytorch_optimizer==4.1.0",
    "bitsandbytes==0.50.2",
    # deepspeed's own requirements that the image lacks (einops, msgpack, ninja, psutil, py-cpuinfo are there)
    "hjson==3.1.0",
    "pydantic==2.14.4",
    "pydantic_core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
)
DEEPSPEED = "deepspeed==0.19.8"
PLATFORM_ARGS = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"] + [
    a for n in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                "manylinux2014_x86_64", "manylinux1_x86_64") for a in ("--platform", n)]
BNB_KEEP = ("libbitsandbytes_cuda130.so", "libbitsandbytes_cpu.so")
LIMIT = 64 * 2**20


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def trim_bitsandbytes(wheel: Path) -> None:
    """Rewrite the wheel without the native libraries of other CUDA/ROCm versions; RECORD lists what remains.
    By hand because the `wheel` tool's unpack/pack is not installed here; the zip layout is the wheel spec's."""
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        def dropped(name: str) -> bool:
            base = os.path.basename(name)
            return base.startswith("libbitsandbytes_") and base not in BNB_KEEP

        for info in src.infolist():
            if dropped(info.filename):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                data = ("\n".join(ln for ln in lines if not dropped(ln.split(",")[0])) + "\n").encode()
            dst.writestr(info, data)
    tmp.replace(wheel)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", default=".whl", help="folder for the wheels (default .whl, git-ignored)")
    a = ap.parse_args(argv)
    dest = Path(a.dest)
    dest.mkdir(parents=True, exist_ok=True)
    _pip("download", "-q", "--no-deps", *PLATFORM_ARGS, "-d", str(dest), *WHEELS)
    if not list(dest.glob("deepspeed-*.whl")):
        with tempfile.TemporaryDirectory() as build:
            env = dict(os.environ, DS_BUILD_OPS="0")  # no CUDA ops compiled here; JIT-built on first use there
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", build, DEEPSPEED], check=True, env=env)
            for w in Path(build).glob("deepspeed-*.whl"):
                w.replace(dest / w.name)
    for w in dest.glob("bitsandbytes-*.whl"):
        trim_bitsandbytes(w)
    wheels = sorted(dest.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels)
    for w in wheels:
        print(f"{w.stat().st_size / 2**20:8.2f} MiB  {w.name}")
    print(f"{total / 2**20:8.2f} MiB  total in {len(wheels)} wheels (limit with the project: {LIMIT / 2**20:.0f} MiB)")
    if total > LIMIT:
        print("too large to travel to the GPU machine: drop a wheel", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
