#!/usr/bin/env bash
# SageAttention 2, the fp8 attention mode's yardstick (issue 38), built from its source on the device machine (no
# network), then `python -m benchmarks attention-kernels --no-sweep` with it. Never committed: SageAttention's code
# (Apache-2.0) comes from a git mirror into an ignored kit. Usage: benchmarks/README.md ("Device scripts").
#   scripts/sage2_for_device.sh --kit GIT_DIR [COMMIT]     # here: .sage2-device/ (carry [".sage2-device"])
#   bash scripts/sage2_for_device.sh                       # there: the sm_90 extension into /tmp, then measure
# COMMIT defaults to the one ComfyUI's fork pins where the mirror has it, else the mirror's HEAD (REVISION says which).
# There: $OUT gets attention-kernels-sage2-h200.json, sage2.log and sage2-build.log. Environment: BUILD_LIMIT (200 s),
# BENCH_LIMIT (150 s), BUDGET_S (100: the command's --budget-s), ONLY_BUILD (set: build and install, measure
# nothing), SHAPES (attention-kernels' --shapes; default all), WORK (/tmp/sage2: the source, its build folder and
# the wheel, kept, so a build cut by its limit resumes on a warm machine's next call).
set -uo pipefail
cd "$(dirname "$0")/.."
kit=.sage2-device
pinned=d1a57a546c3d395b1ffcbeecc66d81db76f3b4b5     # thu-ml/SageAttention as ComfyUI's fork pins it

if [ "${1:-}" = --kit ]; then
    set -e
    git_dir="${2:?--kit GIT_DIR: a git mirror (bare or not) of thu-ml/SageAttention}"
    commit="${3:-}"
    if [ -z "$commit" ]; then
        if git --git-dir="$git_dir" cat-file -e "$pinned^{commit}" 2>/dev/null; then
            commit=$pinned; why="the commit ComfyUI's fork pins"
        else
            commit="$(git --git-dir="$git_dir" rev-parse HEAD)"; why="the mirror's HEAD (the pinned commit is absent)"
        fi
    else
        why="asked for"
    fi
    exclude="$(git rev-parse --git-path info/exclude)"
    grep -qxF "/$kit/" "$exclude" 2>/dev/null || echo "/$kit/" >> "$exclude"
    rm -rf "$kit" && mkdir -p "$kit"
    # what the sm_90 build reads: setup.py (and the README it opens), the CUDA sources, the Python package
    # (a mirror that lacks large blobs makes git archive complain about them, though they are not asked for: the
    # listing below proves what the kit holds)
    git --git-dir="$git_dir" archive --format=tar "$commit" setup.py README.md LICENSE csrc sageattention \
        2>/dev/null | xz -6 > "$kit/sageattention-src.tar.xz"
    listing="$(xz -dc "$kit/sageattention-src.tar.xz" | tar tf -)"
    for needed in setup.py README.md csrc/qattn/qk_int_sv_f8_cuda_sm90.cu csrc/fused/fused.cu sageattention/core.py; do
        grep -qxF "$needed" <<<"$listing" || { echo "kit lacks $needed"; exit 1; }
    done
    printf '%s\n%s\n%s\n' "$commit" "$(git --git-dir="$git_dir" log -1 --format=%cI "$commit")" "$why" \
        > "$kit/REVISION"
    pip=(python3 -m pip); [ -x .venv/bin/python ] && pip=(.venv/bin/python -m pip)
    # unidiff: `python -m benchmarks` imports every command; nvidia-cudnn-frontend: the cudnn_fp8 rows
    "${pip[@]}" download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 unidiff==1.0.1 nvidia-cudnn-frontend==1.14.1 -d "$kit"
    cat "$kit/REVISION"; du -sh "$kit"/*
    exit 0
fi

out=${OUT:-/tmp/out}; mkdir -p "$out"
log="$out/sage2.log"
work=${WORK:-/tmp/sage2}; site="$work/site"
BUILD_LIMIT=${BUILD_LIMIT:-200}; BENCH_LIMIT=${BENCH_LIMIT:-150}; BUDGET_S=${BUDGET_S:-100}
[ -f "$kit/sageattention-src.tar.xz" ] || { echo "no $kit/: run scripts/sage2_for_device.sh --kit here first" \
    | tee -a "$log"; exit 2; }
{ nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader; nvcc --version | tail -n 2
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)'
  echo "SageAttention $(head -n 1 "$kit/REVISION") ($(sed -n 3p "$kit/REVISION"))"; } 2>&1 | tee -a "$log"
mkdir -p "$site" "$work/dist"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    "$kit"/*.whl 2>&1 | tee -a "$log"

if ! ls "$work"/dist/sageattention-*.whl >/dev/null 2>&1; then
    if [ ! -f "$work/src/setup.py" ]; then
        mkdir -p "$work/src" && tar xJf "$kit/sageattention-src.tar.xz" -C "$work/src" || exit 1
    fi
    # setup.py reads TORCH_CUDA_ARCH_LIST but nothing that leaves out its sm80 / sm89 extensions, which it builds
    # for any target from 8.0 up (sageattn imports them in a try and needs neither on sm_90): this runs setup.py as
    # it is, with setuptools.setup keeping only the sm_90 kernels and the quantisers they call (_fused)
    cat > "$work/src/setup_sm90.py" <<'PY'
import setuptools
KEEP = {"sageattention._qattn_sm90", "sageattention._fused"}
_setup = setuptools.setup
def setup(**kwargs):
    kwargs["ext_modules"] = [e for e in kwargs.get("ext_modules", []) if e.name in KEEP]
    print("building", sorted(e.name for e in kwargs["ext_modules"]), flush=True)
    return _setup(**kwargs)
setuptools.setup = setup
exec(compile(open("setup.py", encoding="utf-8").read(), "setup.py", "exec"), {"__name__": "__main__"})
PY
    echo "== $(date -u +%T) build (limit ${BUILD_LIMIT} s)" | tee -a "$log"
    started=$SECONDS
    (cd "$work/src" && TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 EXT_PARALLEL=2 NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:-}" \
        timeout "$BUILD_LIMIT" python3 setup_sm90.py bdist_wheel -d "$work/dist") > "$out/sage2-build.log" 2>&1
    status=$?
    echo "== $(date -u +%T) build exit $status after $((SECONDS - started)) s" | tee -a "$log"
    grep -E "error|Error" "$out/sage2-build.log" | grep -v -- "-Werror" | head -n 20 | tee -a "$log"
    [ "$status" -eq 0 ] || { echo "build incomplete: the same command on this warm machine resumes it" \
        | tee -a "$log"; exit 3; }
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    "$work"/dist/sageattention-*.whl 2>&1 | tee -a "$log"
export PYTHONPATH="$site" PYTHONUNBUFFERED=1
export SAGEATTENTION_SOURCE="thu-ml/SageAttention $(head -n 1 "$kit/REVISION") ($(sed -n 3p "$kit/REVISION")), \
sm_90 extension built on this machine"
python3 -c 'import importlib.metadata as m, sageattention.core as c; print("sageattention", m.version("sageattention"),
"SM90_ENABLED", c.SM90_ENABLED)' 2>&1 | tee -a "$log"
[ -n "${ONLY_BUILD:-}" ] && { echo "built into $site (ONLY_BUILD: no measurement)" | tee -a "$log"; exit 0; }

echo "== $(date -u +%T) attention-kernels (limit ${BENCH_LIMIT} s, budget ${BUDGET_S} s)" | tee -a "$log"
# shellcheck disable=SC2086  # SHAPES is a list of words
timeout "$BENCH_LIMIT" python3 -m benchmarks attention-kernels --no-sweep --budget-s "$BUDGET_S" \
    --out "$out/attention-kernels-sage2-h200.json" ${SHAPES:+--shapes $SHAPES} 2>&1 | tee -a "$log"
echo "== $(date -u +%T) exit ${PIPESTATUS[0]}" | tee -a "$log"
ls -la "$out" | tee -a "$log"
