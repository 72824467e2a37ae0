#!/usr/bin/env bash
# comfy-kitchen for the device machine, which has no network: its cp312 wheel unpacked into .ck/ (in .gitignore)
# without the HIP backend's library (150 MiB, no use on an NVIDIA GPU), small enough to travel with a device run
# (run's carry: [".ck"]; then PYTHONPATH=$PWD/.ck). benchmarks/kernels.py times its CUDA backend when importable.
# Never committed: it is comfy-kitchen's code (Apache-2.0), fetched from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${1:-0.2.40}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
    "comfy-kitchen==$VERSION" -d "$tmp"
rm -rf .ck && mkdir .ck
python3 -m zipfile -e "$tmp"/comfy_kitchen-*.whl .ck
rm -f .ck/comfy_kitchen/backends/hip/_C.abi3.so
du -sh .ck
