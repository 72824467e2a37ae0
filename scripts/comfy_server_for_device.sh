#!/usr/bin/env bash
# A real ComfyUI server (0.33.0 by default) on the device machine, which has no network: the Fused DiT Ops pack
# installed by `python -m applier overlay install`, prompts queued over HTTP (benchmarks/comfy_server_run.py).
# Never committed: the kit holds code of ComfyUI (GPL-3.0) and of packages from PyPI.
#
#   TMPDIR=$PWD/.cache/tmp scripts/comfy_server_for_device.sh --kit TREE
#       here (network): .server-device/ (add /.server-device/ to .git/info/exclude), for the ComfyUI folder TREE
#       named for its release (e.g. .realcomfy/0.33.0): comfy-kitchen and comfy-aimdo at the versions TREE's
#       requirements.txt pins, and trees.tar.xz (TREE's Python and config files), both made by
#       scripts/comfy_kitchen_for_device.sh --kit (run from a copy in a temporary folder, so a .gen-device/ of
#       this checkout is left alone), torchsde and trampoline from there too; the cp312 wheels of what the
#       server needs to start and run a prompt that the device's image lacks (SQLAlchemy, alembic + Mako for its
#       database, pydantic (+ core, annotated-types, typing-inspection, typing-extensions >= 4.16), pydantic-settings
#       + python-dotenv, blake3, simpleeval) and unidiff (applier's own; the image has click, packaging and
#       filelock); PyAV unpacked and xz'd as av.tar.xz (35 MiB as a wheel, 23 as xz).
#       Not carried: comfyui-frontend-package (the server gets an empty --front-end-root), the workflow templates
#       and embedded docs (an error line each in the log, no more), kornia, spandrel, comfy-angle, PyOpenGL (a few
#       comfy_extras nodes fail to import: a warning). trees.tar.xz has what comfy_kitchen_for_device.sh keeps:
#       no comfy_api_nodes/ (the server then loads no partner-API nodes), tests, blueprints, nor files of 1000 KiB
#       and more (tokenizer files: no text encoder is loaded). About 55 MiB; with the repo under one run's 64 MiB.
#   bash scripts/comfy_server_for_device.sh [ERA]
#       on the device machine, from the repo root (run's carry: [".server-device"]): unpack the kit into /tmp,
#       write a random-weight Flux-dev checkpoint (benchmarks/generation.py's ensure_checkpoint, drawn on the GPU,
#       kept in /tmp/comfy-server-ckpt), then benchmarks/comfy_server_run.py on the ERA tree (0.33.0) started as
#       its main.py starts by default (DynamicVRAM on NVIDIA with torch >= 2.8): stock, the node with FP8, stock
#       again, the node without FP8, the node with attention (where it offers it), Flux-dev at 1024x1024, steps
#       2 and 6. $OUT gets comfy-server-ERA.json, its server log (comfy-server-ERA.server.log) and device.log.
# Environment: STEPS ("2 6"), RESOLUTION (1024x1024), TIME_LIMIT (510 s for comfy_server_run.py, the checkpoint's
# writing (at most 300 s) included), SERVER_ARGS (more main.py flags), EXTRA (more comfy_server_run.py arguments, e.g. --tiny),
# KIT (.server-device), WORK (/tmp: where the kit is unpacked and the checkpoint kept).
set -uo pipefail
cd "$(dirname "$0")/.."
kit="${KIT:-.server-device}"

if [ "${1:-}" = "--kit" ]; then
    set -e
    tree="$(cd "${2:?--kit TREE (a ComfyUI folder named for its release)}" && pwd)"
    ck="$(sed -n 's/^comfy-kitchen==\([^ ;]*\).*/\1/p' "$tree/requirements.txt")"
    aimdo="$(sed -n 's/^comfy-aimdo==\([^ ;]*\).*/\1/p' "$tree/requirements.txt")"
    echo "$(basename "$tree"): comfy-kitchen ${ck:?not pinned} comfy-aimdo ${aimdo:?not pinned}"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$tmp/scripts" && cp scripts/comfy_kitchen_for_device.sh "$tmp/scripts/"
    bash "$tmp/scripts/comfy_kitchen_for_device.sh" --kit "$ck" "$aimdo" "$tree"
    rm -rf "$kit" && mkdir -p "$kit"
    mv "$tmp"/.gen-device/{ck.tar.xz,trees.tar.xz} "$tmp"/.gen-device/comfy_aimdo-*.whl \
        "$tmp"/.gen-device/torchsde-*.whl "$tmp"/.gen-device/trampoline-*.whl "$kit/"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$kit" \
        SQLAlchemy==2.1.9 alembic==1.20.1 Mako==1.4.3 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
        typing-inspection==0.4.5 typing-extensions==4.16.0 pydantic-settings==2.16.3 python-dotenv==1.2.4 \
        blake3==1.0.11 simpleeval==1.0.8 unidiff==1.0.1
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$tmp/av" av==19.0.2
    mkdir -p "$tmp/av/site" && python3 -m zipfile -e "$tmp"/av/av-*.whl "$tmp/av/site"
    (cd "$tmp/av/site" && tar cf - . | xz -9 -T2 > "$OLDPWD/$kit/av.tar.xz")
    du -sh "$kit"/* "$kit"
    exit 0
fi

era="${1:-0.33.0}"
out="${OUT:-/tmp/out}"; mkdir -p "$out"
work="${WORK:-/tmp}"
site="$work/comfy-server-site"; trees="$work/comfy-server-trees"; ckpt="$work/comfy-server-ckpt"
log="$out/device.log"
mkdir -p "$site" "$trees" "$ckpt"
{
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "$kit"/*.whl || exit 1
    for part in ck av; do tar xJf "$kit/$part.tar.xz" -C "$site" || exit 1; done
    tar xJf "$kit/trees.tar.xz" -C "$trees" || exit 1
    export PYTHONPATH="$site" PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader
    df -h "$work" | tail -1; free -g | head -2; ls "$trees"
    python3 -c 'import torch, sqlalchemy, pydantic, av, comfy_aimdo, comfy_kitchen, torchsde; print("torch",
        torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available(), "sqlalchemy", sqlalchemy.__version__,
        "pydantic", pydantic.VERSION, "av", av.__version__)'
    echo "== $(date -u +%T) comfy_server_run.py on $era"
    timeout -k 20 "${TIME_LIMIT:-510}" python3 benchmarks/comfy_server_run.py \
        --comfyui "$trees/$era" --make-checkpoint "$ckpt" --model flux-dev \
        --resolution "${RESOLUTION:-1024x1024}" --steps ${STEPS:-2 6} --checkpoint-timeout 300 \
        --startup-timeout 150 --prompt-timeout 120 ${SERVER_ARGS:+--server-args="$SERVER_ARGS"} ${EXTRA:-} \
        --out "$out/comfy-server-$era.json"
    rc=$?
    echo "== $(date -u +%T) exit $rc; disk: $(df -h "$work" | tail -1)"
    ls -la "$out" "$ckpt"
} 2>&1 | grep -v '^USDT\|profiler_st' | tee -a "$log"
