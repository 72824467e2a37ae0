#!/usr/bin/env bash
# On the device machine, from the repo root (carry .realcomfy and .whl): the whole-generation benchmark for one
# model in two invocations (everything but compilation, then the two compile configs), and for Flux the real
# ComfyUI server run in between. Each phase has its own time limit; JSONs land in $OUT.
#   [FLUX_CHECK=SECONDS] bash scripts/generation_for_device.sh flux-dev|wan2.1-t2v-14b [SECONDS_A SECONDS_SERVER SECONDS_COMPILE]
set -uo pipefail
model=${1:?model: flux-dev or wan2.1-t2v-14b}
limit_a=${2:-300}; limit_server=${3:-150}; limit_compile=${4:-200}
out=${OUT:-/tmp/out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
work=/tmp/generation; mkdir -p "$work"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
df -h /tmp | tail -1; free -g | head -2
if [ -n "${FLUX_CHECK:-}" ]; then   # Flux 1024 stock and overlay again, weights from a state dict
    date -u +%T; timeout "$FLUX_CHECK" python3 benchmarks/generation.py --comfyui .realcomfy/ComfyUI --models flux-dev \
        --resolutions 1024x1024 --steps 4 --warmup-steps 1 --configs stock,overlay \
        --out "$out/generation-flux-check.json" 2>&1 | grep -v '^USDT\|profiler_st'
fi
common=(--comfyui .realcomfy/ComfyUI --models "$model" --steps 4 --warmup-steps 1 --work-dir "$work")
save=(); [ "$model" = flux-dev ] && save=(--save-checkpoint)
date -u +%T; timeout "$limit_a" python3 benchmarks/generation.py "${common[@]}" "${save[@]}" \
    --configs stock,overlay,overlay_fp8,comfy_fp8,overlay_fp8@fp8_e4m3fn,comfy_fp8_fast,comfy_fp8_fast:eval \
    --out "$out/generation-$model-a.json" 2>&1 | grep -v '^USDT\|profiler_st' | tee "$out/generation-$model-a.log"
if [ "$model" = flux-dev ]; then
    date -u +%T; cp -r .realcomfy/ComfyUI /tmp/comfyserver
    timeout "$limit_server" python3 benchmarks/comfy_server_run.py --comfyui /tmp/comfyserver \
        --checkpoint "$work/flux-dev-random-seed0.safetensors" --model flux-dev --startup-timeout 60 --prompt-timeout 90 --out "$out/comfy-server.json"
    echo "server exit $?"
fi
date -u +%T; resolutions=(); [ "$model" = flux-dev ] && resolutions=(--resolutions 1024x1024)
timeout "$limit_compile" python3 benchmarks/generation.py "${common[@]}" "${save[@]}" "${resolutions[@]}" \
    --configs compile,overlay_compile --out "$out/generation-$model-c.json" 2>&1 \
    | grep -v '^USDT\|profiler_st' | tee "$out/generation-$model-c.log"
date -u +%T; ls -la "$out"
