#!/usr/bin/env bash
# Any `python -m benchmarks` commands on the device machine (no network), one per PHASE, each in its own process
# under its own time limit, from the kit made by scripts/comfy_kitchen_for_device.sh. Usage: benchmarks/README.md.
#   bash scripts/bench_for_device.sh 'SECONDS|ERA|COMMAND ARGS...'...
# ERA names the ComfyUI tree whose pins go on PYTHONPATH ('-': none); '@OUT' and '@TREES' in the arguments become
# $OUT and the folder of unpacked trees. The log is $OUT/bench.log.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
source scripts/device_kit.sh
log="$out/bench.log"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader 2>&1 | tee -a "$log"
for phase in "$@"; do
    IFS="|" read -r seconds era command <<<"$phase"
    command="${command//@OUT/$out}"; command="${command//@TREES/$trees}"
    path="$site"; [ "$era" != - ] && path="$(era_path "$era")"
    echo "== $(date -u +%T) phase ($seconds s, $era): $command" | tee -a "$log"
    # shellcheck disable=SC2086  # the phase's words are the command's arguments
    PYTHONPATH="$path" timeout "$seconds" python3 -m benchmarks $command 2>&1 | grep -v '^USDT\|profiler_st' \
        | tee -a "$log"
    echo "== $(date -u +%T) exit ${PIPESTATUS[0]}" | tee -a "$log"
done
ls -la "$out" | tee -a "$log"
