#!/usr/bin/env bash
# On the device machine, from the repo root (carry [".gen-device"], made by scripts/comfy_kitchen_for_device.sh
# --kit): unpack comfy-kitchen, comfy-aimdo, torchsde, sageattention and the ComfyUI trees into /tmp, then run
# benchmarks/generation.py once per PHASE, each in its own process (as each ComfyUI server is its own process) and
# under its own time limit; every phase's JSON lands in $OUT as gen-ERA-MODEL[-TAG].json (MODEL may be a comma
# list, written with '_'), the log as gen.log.
#   bash scripts/generation_for_device.sh PHASE...
#   PHASE = 'ERA|MODEL|SECONDS|CONFIGS[|RESOLUTIONS[|TAG[|EXTRA]]]', e.g.
#           '0.3.64|flux-dev|240|stock,overlay,comfy_fp8_fast:eval|1024x1024,2048x2048'
#   CONFIGS and RESOLUTIONS are generation.py's comma lists (RESOLUTIONS empty: all of the model's);
#   EXTRA is more generation.py arguments, words separated by '+', e.g. --tiny+--steps+2 or
#   --skip+flux-dev/2048x2048/comfy_sage. Each phase starts no run in its last 35 seconds.
# Environment: STEPS (4), WARMUP (1), CHECKPOINT (file: load from a safetensors file as UNETLoader does; else from
# a state dict); the work folder /tmp/generation keeps checkpoints and stock latents between phases.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
site=/tmp/site; trees=/tmp/trees; work=/tmp/generation
mkdir -p "$site" "$trees" "$work"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    .gen-device/*.whl || exit 1
tar xJf .gen-device/ck.tar.xz -C "$site" && tar xJf .gen-device/trees.tar.xz -C "$trees" || exit 1
export PYTHONPATH=$site PYTHONUNBUFFERED=1
log="$out/gen.log"
{ nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
  df -h /tmp | tail -1; free -g | head -2; ls "$trees"; } 2>&1 | tee -a "$log"
for phase in "$@"; do
    IFS="|" read -r era model seconds configs resolutions tag extra <<<"$phase"
    args=(--comfyui "$trees/$era" --models "$model" --configs "$configs" --steps "${STEPS:-4}"
          --warmup-steps "${WARMUP:-1}" --work-dir "$work" --time-budget "$((seconds - 35))")
    [ -n "$resolutions" ] && args+=(--resolutions "$resolutions")
    [ "${CHECKPOINT:-file}" = file ] && args+=(--save-checkpoint)
    [ -n "$extra" ] && IFS=+ read -r -a more <<<"$extra" && args+=("${more[@]}")
    name="gen-$era-${model//,/_}${tag:+-$tag}.json"
    echo "== $(date -u +%T) phase $phase" | tee -a "$log"
    timeout "$seconds" python3 benchmarks/generation.py "${args[@]}" --out "$out/$name" 2>&1 \
        | grep -v '^USDT\|profiler_st' | tee -a "$log"
    echo "== $(date -u +%T) exit ${PIPESTATUS[0]}; disk: $(df -h /tmp | tail -1)" | tee -a "$log"
done
ls -la "$out" "$work" | tee -a "$log"
