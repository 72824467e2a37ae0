#!/usr/bin/env bash
# `python -m benchmarks generation` once per PHASE on the device machine (no network), from the kit made by
# scripts/comfy_kitchen_for_device.sh --kit. Usage, phases and environment: benchmarks/README.md ("Device scripts").
#   bash scripts/generation_for_device.sh 'ERA|MODEL|SECONDS|CONFIGS[|RESOLUTIONS[|TAG[|EXTRA]]]'...
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
work=/tmp/generation; mkdir -p "$work"
source scripts/device_kit.sh
log="$out/gen.log"
{ nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
  df -h /tmp | tail -1; free -g | head -2; ls "$trees"; } 2>&1 | tee -a "$log"
n=0
for phase in "$@"; do
    IFS="|" read -r era model seconds configs resolutions tag extra <<<"$phase"
    args=(--comfyui "$trees/$era" --models "$model" --configs "$configs" --steps "${STEPS:-4}"
          --warmup-steps "${WARMUP:-1}" --work-dir "$work" --time-budget "$((seconds - 35))")
    [ -n "$resolutions" ] && args+=(--resolutions "$resolutions")
    [ "${CHECKPOINT:-file}" = file ] && args+=(--save-checkpoint)
    [ -n "$extra" ] && IFS=+ read -r -a more <<<"$extra" && args+=("${more[@]}")
    name="gen-$era-${model//,/_}${tag:+-$tag}.json"
    # two phases of one model and no TAG: the later one gets its phase number, never the earlier one's file
    [ -e "$out/$name" ] && name="${name%.json}-phase$((n + 1)).json"
    n=$((n + 1))
    echo "== $(date -u +%T) phase $phase" | tee -a "$log"
    PYTHONPATH="${PREPEND_PATH:+$PREPEND_PATH:}$(era_path "$era")" timeout "$seconds" python3 -m benchmarks generation "${args[@]}" --out "$out/$name" 2>&1 \
        | grep -v '^USDT\|profiler_st' | tee -a "$log"
    echo "== $(date -u +%T) exit ${PIPESTATUS[0]}; disk: $(df -h /tmp | tail -1)" | tee -a "$log"
done
ls -la "$out" "$work" | tee -a "$log"
