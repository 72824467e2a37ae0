#!/usr/bin/env bash
# `python -m benchmarks generation` once per PHASE on the device machine (no network), from the kit made by
# scripts/comfy_kitchen_for_device.sh --kit. Usage, phases and environment: benchmarks/README.md ("Device scripts").
#   bash scripts/generation_for_device.sh 'ERA|MODEL|SECONDS|CONFIGS[|RESOLUTIONS[|TAG[|EXTRA]]]'...
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
source scripts/device_kit.sh
log="$out/gen.log"
{ nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
  df -h /tmp | tail -1; free -g | head -2; ls "$trees"; } 2>&1 | tee -a "$log"

# one phase: run_phase N PHASE WORK LOG
run_phase() {
    local n=$1 phase=$2 work=$3 log=$4 era model seconds configs resolutions tag extra name path kept
    IFS="|" read -r era model seconds configs resolutions tag extra <<<"$phase"
    mkdir -p "$work"
    # DROP_CHECKPOINTS=1: other models' checkpoint files go first (issue 50's models are 13-40 GB each)
    if [ "${DROP_CHECKPOINTS:-0}" = 1 ]; then
        for path in "$work"/*.safetensors; do
            [ -e "$path" ] || continue
            kept=0
            for m in ${model//,/ }; do [[ "$(basename "$path")" == "$m"-* ]] && kept=1; done
            [ $kept = 1 ] || rm -f "$path"
        done
    fi
    local args=(--comfyui "$trees/$era" --models "$model" --configs "$configs" --steps "${STEPS:-4}"
                --warmup-steps "${WARMUP:-1}" --work-dir "$work" --time-budget "$((seconds - 35))")
    [ -n "$resolutions" ] && args+=(--resolutions "$resolutions")
    [ "${CHECKPOINT:-file}" = file ] && args+=(--save-checkpoint)
    [ -n "$extra" ] && IFS=+ read -r -a more <<<"$extra" && args+=("${more[@]}")
    name="gen-$era-${model//,/_}${tag:+-$tag}.json"
    # two phases of one model and no TAG: the later one gets its phase number, never the earlier one's file
    [ -e "$out/$name" ] && name="${name%.json}-phase$n.json"
    echo "== $(date -u +%T) phase $phase${CUDA_VISIBLE_DEVICES:+ on GPU $CUDA_VISIBLE_DEVICES}" | tee -a "$log"
    PYTHONPATH="${PREPEND_PATH:+$PREPEND_PATH:}$(era_path "$era")" timeout "$seconds" python3 -m benchmarks generation "${args[@]}" --out "$out/$name" 2>&1 \
        | grep -v '^USDT\|profiler_st' | tee -a "$log"
    echo "== $(date -u +%T) exit ${PIPESTATUS[0]}; disk: $(df -h /tmp | tail -1)" | tee -a "$log"
}

n=0
for phase in "$@"; do
    n=$((n + 1))
    if [ "${PARALLEL:-0}" = 1 ]; then
        # PARALLEL=1 (a machine of several GPUs): phase N runs at once on GPU N-1, in /tmp/generation-N, its log
        # gen-N.log; the pinned site folder is unpacked before any starts
        era_path "${phase%%|*}" >/dev/null
        CUDA_VISIBLE_DEVICES=$((n - 1)) run_phase "$n" "$phase" "/tmp/generation-$n" "$out/gen-$n.log" &
        sleep 2
    else
        run_phase "$n" "$phase" /tmp/generation "$log"
    fi
done
wait
ls -la "$out" /tmp/generation* | tee -a "$log"
