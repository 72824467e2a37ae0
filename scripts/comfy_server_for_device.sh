#!/usr/bin/env bash
# A real ComfyUI server (0.33.0 by default) on the device machine, which has no network: the pack installed by
# `python -m applier overlay install`, prompts queued over HTTP (`python -m benchmarks comfy-server`). Never committed:
# the kit holds ComfyUI's code (GPL-3.0) and packages from PyPI. Usage and environment: benchmarks/README.md.
#   TMPDIR=$PWD/.cache/tmp scripts/comfy_server_for_device.sh --kit TREE     # here (network): .server-device/
#   bash scripts/comfy_server_for_device.sh [ERA]                            # there (carry [".server-device"])
#   COMMAND=canvas-pipeline bash scripts/comfy_server_for_device.sh [ERA]    # there: the 32K canvas pipeline
#   COMMAND=tiled-route bash scripts/comfy_server_for_device.sh [ERA]        # there: the tiled 32K route, detached
#     (setsid: it outlives the call; the same command again waits for it and copies its JSON and logs to $OUT)
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
    # the peer of tiled-route (never committed): ComfyUI-TiledDiffusion as its mirror's HEAD, with its commit
    peer="${TILED_DIFFUSION_MIRROR:-}"   # a git mirror of shiimizu/ComfyUI-TiledDiffusion
    if git --git-dir="$peer" rev-parse -q --verify HEAD >/dev/null 2>&1; then
        mkdir -p "$tmp/peer/ComfyUI-TiledDiffusion"
        git --git-dir="$peer" archive HEAD | tar x -C "$tmp/peer/ComfyUI-TiledDiffusion"
        git --git-dir="$peer" log -1 --format='%H%n%cI' HEAD > "$tmp/peer/ComfyUI-TiledDiffusion/REVISION"
        (cd "$tmp/peer" && tar cf - ComfyUI-TiledDiffusion | xz -9 -T2 > "$OLDPWD/$kit/tiled-diffusion.tar.xz")
    else
        echo "no ComfyUI-TiledDiffusion mirror (TILED_DIFFUSION_MIRROR=${peer:-unset}): the kit has no tiled-route peer"
    fi
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
    # unpacked once per machine: a detached tiled-route run may be using it while a later call waits for it
    if [ ! -e "$site/.unpacked" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
            "$kit"/*.whl || exit 1
        for part in ck av; do tar xJf "$kit/$part.tar.xz" -C "$site" || exit 1; done
        tar xJf "$kit/trees.tar.xz" -C "$trees" || exit 1
        touch "$site/.unpacked"
    fi
    export PYTHONPATH="$site" PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader
    df -h "$work" | tail -1; free -g | head -2; ls "$trees"
    python3 -c 'import torch, sqlalchemy, pydantic, av, comfy_aimdo, comfy_kitchen, torchsde; print("torch",
        torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available(), "sqlalchemy", sqlalchemy.__version__,
        "pydantic", pydantic.VERSION, "av", av.__version__)'
    echo "== $(date -u +%T) benchmarks ${COMMAND:-comfy-server} on $era"
    if [ "${COMMAND:-comfy-server}" = tiled-route ]; then
        # one detached harness per machine (setsid: it lives until the machine goes back); each call waits for it
        # up to TIME_LIMIT (480 s: the first call also unpacks the kit; 540 fits a later 600 s call) and copies what
        # it wrote so far. The harness's own limit: ROUTE_LIMIT (1700 s). RUN=NAME: another run beside the first (its
        # own folder and tiled-route-ERA-NAME.json; the kit and the checkpoint are shared); NO_PEER=1: no peer.
        run="$work/tiled-route${RUN:+-$RUN}"; mkdir -p "$run"
        if [ ! -e "$run/pid" ] && [ -n "${VAE_CHECK:-}" ]; then
            # the one-pass tiled VAE against ComfyUI's tiled and untiled VAE (in process, before the route holds
            # the GPU): VAE_CHECK=WxH, the canvas where the untiled decode fits
            timeout -k 20 "${VAE_LIMIT:-300}" python3 -m benchmarks tiled-vae --comfyui "$trees/$era" \
                --work "$run/vae-check" --size "$VAE_CHECK" --out "$out/tiled-vae-$era.json"
            cp "$out/tiled-vae-$era.json" "$run/" 2>/dev/null
        fi
        if [ ! -e "$run/pid" ]; then
            peer_arg=()
            if [ -f "$kit/tiled-diffusion.tar.xz" ] && [ -z "${NO_PEER:-}" ]; then
                mkdir -p "$run/peers" && tar xJf "$kit/tiled-diffusion.tar.xz" -C "$run/peers" &&
                    peer_arg=(--peer "tiled-diffusion=$run/peers/ComfyUI-TiledDiffusion")
            fi
            harness=(timeout -k 20 "${ROUTE_LIMIT:-1700}" python3 -m benchmarks tiled-route --comfyui "$trees/$era"
                     --work "$run/work" --make-checkpoint "$ckpt" --startup-timeout 150 "${peer_arg[@]}"
                     ${SERVER_ARGS:+--server-args="$SERVER_ARGS"} ${EXTRA:-}
                     --out "$run/tiled-route-$era${RUN:+-$RUN}.json")
            echo "detached: ${harness[*]}"
            setsid bash -c '"$@" > "$0/harness.log" 2>&1; echo $? > "$0/rc"' "$run" "${harness[@]}" \
                < /dev/null > /dev/null 2>&1 &
            echo $! > "$run/pid"
        else
            echo "a tiled-route run is there already (pid $(cat "$run/pid")): waiting for it"
        fi
        deadline=$((SECONDS + ${TIME_LIMIT:-480}))
        while [ ! -e "$run/rc" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 5; done
        cp "$run"/*.json "$run"/*.log "$out/" 2>/dev/null
        tail -n 40 "$run/harness.log"
        if [ -e "$run/rc" ]; then echo "== tiled-route finished: exit $(cat "$run/rc")"
        else echo "== tiled-route still running: run the same command again to wait for it"; fi
        (exit "$(cat "$run/rc" 2>/dev/null || echo 3)")
    elif [ "${COMMAND:-comfy-server}" = canvas-pipeline ]; then
        timeout -k 20 "${TIME_LIMIT:-510}" python3 -m benchmarks canvas-pipeline --comfyui "$trees/$era" \
            --work "$work/canvas" --startup-timeout 150 ${SERVER_ARGS:+--server-args="$SERVER_ARGS"} ${EXTRA:-} \
            --out "$out/canvas-pipeline-$era.json"
    else
        timeout -k 20 "${TIME_LIMIT:-510}" python3 -m benchmarks comfy-server \
            --comfyui "$trees/$era" --make-checkpoint "$ckpt" --model flux-dev \
            --resolution "${RESOLUTION:-1024x1024}" --steps ${STEPS:-2 6} --checkpoint-timeout 300 \
            --startup-timeout 150 --prompt-timeout 120 ${SERVER_ARGS:+--server-args="$SERVER_ARGS"} ${EXTRA:-} \
            --out "$out/comfy-server-$era.json"
    fi
    rc=$?
    echo "== $(date -u +%T) exit $rc; disk: $(df -h "$work" | tail -1)"
    ls -la "$out" "$ckpt"
} 2>&1 | grep -v '^USDT\|profiler_st' | tee -a "$log"
