# Sourced by the device scripts (bash): unpacks the kit that scripts/comfy_kitchen_for_device.sh made into /tmp and
# defines era_path ERA, the PYTHONPATH for one ComfyUI tree's phases (a --kit-pinned kit gives each tree its pins).
site=/tmp/site; trees=/tmp/trees
mkdir -p "$site" "$trees"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    .gen-device/*.whl || exit 1
tar xJf .gen-device/trees.tar.xz -C "$trees" || exit 1
if [ -f .gen-device/ck.tar.xz ]; then tar xJf .gen-device/ck.tar.xz -C "$site" || exit 1; fi
export PYTHONPATH=$site PYTHONUNBUFFERED=1
era_path() {
    local line ck aimdo dir
    line="$(grep "^$1 " .gen-device/pins.txt 2>/dev/null)" || { echo "$site"; return; }
    read -r _ ck aimdo <<<"$line"
    dir="/tmp/site-$1"
    if [ ! -d "$dir" ]; then
        mkdir -p "$dir"
        [ "$ck" != - ] && tar xJf ".gen-device/ck-$ck.tar.xz" -C "$dir"
        [ "$aimdo" != - ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --target "$dir" .gen-device/aimdo-"$aimdo"/*.whl
    fi
    echo "$dir:$site"
}
