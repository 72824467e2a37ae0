#!/usr/bin/env bash
# FlashAttention-4 (`flash-attn-4`, CuTe DSL: one more exact attention candidate the node times where it imports,
# issue 38) for the device machine (no network). Never committed: the wheels go, unpacked into one site folder, into
# two ignored kit folders, because its cu13 libraries (a 92 MB wheel, 237 MB unpacked) pass the 64 MiB a call may
# carry only in two calls on a machine kept warm. Usage: benchmarks/README.md ("Device scripts").
#   scripts/fa4_for_device.sh --kit               # here: .fa4-a/ (56 MB) and .fa4-b/ (the rest)
#   bash scripts/fa4_for_device.sh park           # there, carry [".fa4-a"]: part one into /tmp/fa4parts
#   bash scripts/fa4_for_device.sh unpack         # there, the next call, carry [".fa4-b", ...]: /tmp/fa4site
# Then PREPEND_PATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages bash scripts/generation_for_device.sh
# ... runs ComfyUI with FlashAttention-4 importable (the second folder is what the CUTLASS DSL's .pth file adds to
# sys.path in a site-packages; a PYTHONPATH folder's .pth files are not read). Versions: FA4 (default 4.0.0b36, the one issue 38 measured) and the CUTLASS DSL, quack-kernels,
# apache-tvm-ffi and torch-c-dlpack-ext releases of its time.
set -uo pipefail
cd "$(dirname "$0")/.."
FA4=${FA4:-4.0.0b36}
pins=("flash-attn-4==$FA4" nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
      nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5
      apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5)
part_bytes=56000000

case "${1:-}" in
--kit)
    set -e
    work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
    pip=(python3 -m pip); [ -x .venv/bin/python ] && pip=(.venv/bin/python -m pip)
    platforms=(); for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
                         manylinux2014_x86_64; do platforms+=(--platform "$p"); done
    "${pip[@]}" download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d "$work/wheels" "${pins[@]}"
    mkdir -p "$work/site"
    for wheel in "$work"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$work/site"; done
    tar cf - -C "$work/site" . | xz -9 -T2 > "$work/fa4site.tar.xz"
    exclude="$(git rev-parse --git-path info/exclude)"
    for kit in .fa4-a .fa4-b; do
        grep -qxF "/$kit/" "$exclude" 2>/dev/null || echo "/$kit/" >> "$exclude"
        rm -rf "$kit" && mkdir -p "$kit"
    done
    split -b "$part_bytes" "$work/fa4site.tar.xz" "$work/part."
    mv "$work/part.aa" .fa4-a/ && mv "$work/part.ab" .fa4-b/
    [ ! -e "$work/part.ac" ] || { echo "the kit needs a third part: raise part_bytes"; exit 1; }
    sha256sum "$work/fa4site.tar.xz" | cut -d' ' -f1 > .fa4-b/SHA256
    ls "$work/wheels"; du -sh .fa4-a .fa4-b
    ;;
park)
    mkdir -p /tmp/fa4parts && cp .fa4-a/part.aa /tmp/fa4parts/ && ls -la /tmp/fa4parts
    ;;
unpack)
    [ -f /tmp/fa4parts/part.aa ] || { echo "no /tmp/fa4parts/part.aa: the machine went cold; park again"; exit 3; }
    if [ -f .fa4-b/SHA256 ]; then
        [ "$(cat /tmp/fa4parts/part.aa .fa4-b/part.ab | sha256sum | cut -d' ' -f1)" = "$(cat .fa4-b/SHA256)" ] \
            || { echo "the two parts do not make the kit's archive"; exit 4; }
    fi
    mkdir -p /tmp/fa4site && cat /tmp/fa4parts/part.aa .fa4-b/part.ab | tar xJf - -C /tmp/fa4site || exit 4
    PYTHONPATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages timeout 120 python3 -c \
        'import flash_attn.cute as c; print("FlashAttention-4 imports:", c.flash_attn_func.__module__)'
    ;;
*)
    echo "usage: scripts/fa4_for_device.sh --kit | park | unpack"; exit 2
    ;;
esac
