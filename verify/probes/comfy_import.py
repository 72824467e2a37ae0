"""Probe for comfyui/max-resolution (`applier verify --real-import`): the resolution the target's ComfyUI really
serves.

Runs in the target's interpreter (see verify/README.md). Imports the target's nodes.py the way ComfyUI's main.py
does, minimally: the ComfyUI root first on sys.path and, for a real checkout (comfy/cli_args.py exists), argument
parsing enabled with `--cpu` so that comfy.model_management never touches a GPU. Then reads `nodes.MAX_RESOLUTION`
and the width max of EmptyLatentImage's INPUT_TYPES, which is what the UI offers and what execution.py's
validation enforces. A real nodes.py needs torch and ComfyUI's requirements installed in that interpreter.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -I leaves this folder off sys.path
from _probe import emit, import_comfy_nodes, inside, run  # noqa: E402 - importable only after the line above


def main(args):
    root = args.get("comfyui_root")
    if not root:
        return emit("SKIP", "the target has no ComfyUI root", {})
    expect = args.get("expect") or {}
    nodes, real = import_comfy_nodes(root)
    numbers = {"nodes_file": getattr(nodes, "__file__", None), "real_comfyui": real}
    if not inside(numbers["nodes_file"] or "", root):
        return emit("FAIL", f"`import nodes` loaded {numbers['nodes_file']}, not the target's nodes.py", numbers)
    max_resolution = getattr(nodes, "MAX_RESOLUTION", None)
    numbers["max_resolution"] = max_resolution
    node = nodes.NODE_CLASS_MAPPINGS.get("EmptyLatentImage")
    if node is None:
        return emit("FAIL", "nodes.NODE_CLASS_MAPPINGS has no EmptyLatentImage", numbers)
    width_max = node.INPUT_TYPES()["required"]["width"][1].get("max")
    numbers["empty_latent_width_max"] = width_max

    if width_max != max_resolution:
        return emit("FAIL", f"EmptyLatentImage's width max is {width_max} but nodes.MAX_RESOLUTION is "
                            f"{max_resolution}", numbers)
    wanted = expect.get("max_resolution")
    numbers["expected_max_resolution"] = wanted
    if expect.get("applied") and wanted is not None and width_max != wanted:
        return emit("FAIL", f"the patch is recorded as applied (MAX_RESOLUTION = {wanted}) but the imported "
                            f"nodes.py serves {width_max}", numbers)
    state = "patched" if expect.get("applied") else "as installed"
    return emit("PASS", f"EmptyLatentImage accepts widths up to {width_max} ({state}; nodes.MAX_RESOLUTION = "
                        f"{max_resolution}{'' if real else ', a ComfyUI-shaped tree'})", numbers)


if __name__ == "__main__":
    run(main)
