#!/usr/bin/env bash
# comfy-kitchen (and, with --kit, everything `python -m benchmarks generation` needs) for the device machine, which
# has no network. Never committed: comfy-kitchen's code (Apache-2.0) from PyPI, ComfyUI's code (GPL-3.0) from trees.
# Usage: benchmarks/README.md ("Device scripts").
#   scripts/comfy_kitchen_for_device.sh [VERSION]                        # .ck/ (carry [".ck"])
#   scripts/comfy_kitchen_for_device.sh --kit VERSION AIMDO_VERSION TREE...   # .gen-device/ (carry [".gen-device"])
#   scripts/comfy_kitchen_for_device.sh --kit-pinned TREE...     # .gen-device/, each TREE with its requirements' pins
set -euo pipefail
cd "$(dirname "$0")/.."
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

fetch_kitchen() {   # VERSION DEST: unpacked, HIP library removed
    pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
        "comfy-kitchen==$1" -d "$tmp/ck-wheel-$1"
    rm -rf "$2" && mkdir -p "$2"
    python3 -m zipfile -e "$tmp"/ck-wheel-"$1"/comfy_kitchen-*.whl "$2"
    rm -f "$2/comfy_kitchen/backends/hip/_C.abi3.so"
}

if [ "${1:-}" != "--kit" ] && [ "${1:-}" != "--kit-pinned" ]; then
    VERSION="${1:-0.2.40}"
    fetch_kitchen "$VERSION" .ck
    du -sh .ck
    exit 0
fi

pin_of() {   # TREE PACKAGE: the version TREE's requirements.txt pins, or nothing
    sed -n "s/^$2==\([^ ;]*\).*/\1/p" "$1/requirements.txt" 2>/dev/null
}

kit=.gen-device
rm -rf "$kit" && mkdir -p "$kit"
if [ "$1" = "--kit-pinned" ]; then
    # each TREE with the comfy-kitchen and comfy-aimdo its requirements.txt pins (none where it pins none):
    # ck-VERSION.tar.xz, aimdo-VERSION/*.whl, and pins.txt ("tree ck aimdo", '-' for none) for the device script
    shift
    for tree in "$@"; do
        ck="$(pin_of "$tree" comfy-kitchen)"; aimdo="$(pin_of "$tree" comfy-aimdo)"
        echo "$(basename "$tree") ${ck:--} ${aimdo:--}" >> "$kit/pins.txt"
        if [ -n "$ck" ] && [ ! -f "$kit/ck-$ck.tar.xz" ]; then
            fetch_kitchen "$ck" "$tmp/ck-$ck"
            (cd "$tmp/ck-$ck" && tar cf - . | xz -9 -T2 > "$OLDPWD/$kit/ck-$ck.tar.xz")
        fi
        if [ -n "$aimdo" ] && [ ! -d "$kit/aimdo-$aimdo" ]; then
            pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
                "${platforms[@]}" "comfy-aimdo==$aimdo" -d "$kit/aimdo-$aimdo"
        fi
    done
    cat "$kit/pins.txt"
else
    shift
    VERSION="${1:?--kit VERSION AIMDO_VERSION TREE...}"; AIMDO="${2:?AIMDO_VERSION}"; shift 2
    fetch_kitchen "$VERSION" "$tmp/ck"
    (cd "$tmp/ck" && tar cf - . | xz -9 -T2 > "$OLDPWD/$kit/ck.tar.xz")
    pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
        "comfy-aimdo==$AIMDO" -d "$kit"
fi
pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    torchsde==0.2.6 trampoline==0.1.2 sageattention==1.0.6 unidiff==1.0.1 nvidia-cudnn-frontend==1.14.1 -d "$kit"
mkdir -p "$tmp/trees"
for tree in "$@"; do
    name="$(basename "$tree")"
    mkdir -p "$tmp/trees/$name"
    (cd "$tree" && find . \( -path ./.git -o -path ./comfy_api_nodes -o -path ./tests -o -path ./tests-unit \
            -o -path ./input -o -path ./output -o -path ./models -o -path ./script_examples -o -path ./blueprints \
            -o -name __pycache__ \) -prune -o -type f \( -name '*.py' -o -name '*.json' -o -name '*.yaml' \
            -o -name '*.txt' -o -name '*.toml' -o -name '*.ini' -o -name REVISION \) -size -1000k -print \
        | tar cf - -T - | (cd "$tmp/trees/$name" && tar xf -))
done
(cd "$tmp/trees" && tar cf - . | xz -6 -T2 > "$OLDPWD/$kit/trees.tar.xz")
du -sh "$kit"/*
