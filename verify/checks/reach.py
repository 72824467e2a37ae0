"""reach (with `verify --size WxH`): every cap below that size on a large canvas's way through the tree.

Read statically, with resolution.py's readers and within its bounds (never importing the tree):
- MAX_RESOLUTION in nodes.py, and the core nodes (nodes.py, comfy_extras/) whose width/height input takes it as
  its max: a side above it is refused by ComfyUI's validation (FAIL);
- Pillow's decompression-bomb bound as LoadImage meets it (the target's PIL/Image.py, raised where nodes.py raises
  it: applier.budget.caps): an image above twice the bound is refused by Image.open (FAIL);
- the tiled VAE nodes (classes named *Tiled in nodes.py and comfy_extras/): they take the canvas whole, as a LATENT
  or an IMAGE; their tile inputs' literal max bounds the tile, not the canvas, and is listed, never a finding;
- hard-coded width/height/resolution caps in comfy_extras/ and custom_nodes/ (resolution.scan_resolution_caps),
  each below the side it limits (a height cap against the height): its node refuses the size only where a workflow
  uses it (WARN). Files the scan skipped or a bound it reached are a WARN too. PASS when nothing is below the size.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

from applier.errors import ApplierError

from ..registry import CheckResult, Outcome, check
from . import resolution

SHOWN = 5
PIL_PATCH = "comfyui/pil-pixel-limit"


def _names_max_resolution(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id.endswith("MAX_RESOLUTION")) or \
        (isinstance(node, ast.Attribute) and node.attr.endswith("MAX_RESOLUTION"))


def _option_max(options: ast.AST) -> ast.AST | None:
    """The "max" value of an input's options: ("INT", {"max": ...})."""
    for element in getattr(options, "elts", []):
        if isinstance(element, ast.Dict):
            for key, value in zip(element.keys, element.values):
                if isinstance(key, ast.Constant) and key.value == "max":
                    return value
    return None


def read_nodes(data: bytes, relpath: str) -> tuple[dict, list[str]]:
    """({node: "file:line"} of the classes whose width/height input takes MAX_RESOLUTION as its max, and
    "file:line Node input max N" of the tile inputs of *Tiled classes)."""
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}, []
    spans = resolution.class_spans(tree)
    following, tiles = {}, []
    for node in ast.walk(tree):
        inputs = []
        if isinstance(node, ast.Dict):
            inputs = [(k.value, _option_max(v)) for k, v in zip(node.keys, node.values)
                      if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        elif isinstance(node, ast.Call) and resolution._input_name(node):
            inputs = [(resolution._input_name(node), kw.value) for kw in node.keywords if kw.arg == "max"]
        for name, maximum in inputs:
            if maximum is None:
                continue
            owner = resolution.enclosing_class(spans, maximum.lineno)
            if resolution.DIMENSION_INPUT.search(name) and _names_max_resolution(maximum) and owner:
                following.setdefault(owner, f"{relpath}:{maximum.lineno}")
            value = resolution.int_value(maximum)
            if "tile" in name.lower() and "Tiled" in owner and value is not None:
                tiles.append(f"{relpath}:{maximum.lineno} {owner} {name} max {value}")
    return following, tiles


def core_nodes(root: Path, scan: resolution.CapScan) -> tuple[dict, list[str]]:
    """read_nodes over nodes.py and comfy_extras/*.py (the scan's own walk and bounds)."""
    inside = Path(os.path.realpath(root))
    following, tiles = {}, []
    for path in [root / "nodes.py", *resolution._python_files(root / "comfy_extras", False, scan)]:
        data, _ = resolution.read_scanned(path, inside)
        if data is not None and (b"MAX_RESOLUTION" in data or b"Tiled" in data):
            found, tiled = read_nodes(data, path.relative_to(root).as_posix())
            following.update({k: v for k, v in found.items() if k not in following})
            tiles += tiled
    return following, tiles


def side_of(cap: resolution.Cap, width: int, height: int) -> int:
    """The side a cap limits: a height input the height, a width input the width, anything else the longer."""
    what = cap.what.lower()
    return height if "height" in what else width if "width" in what else max(width, height)


def _shown(items: list[str]) -> str:
    return ", ".join(items[:SHOWN]) + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


@check("reach", "with --size WxH: every cap below that size on the canvas's way (MAX_RESOLUTION and the core "
       "nodes that take it, Pillow's bound for LoadImage, tiled VAE nodes, hard-coded caps of extras and custom "
       "nodes)", opt_in="size")
def reach(ctx) -> CheckResult:
    name = "reach"
    size = getattr(ctx.options, "size", None)
    if not size:
        return CheckResult(name, Outcome.SKIP, "no size to check: give --size WxH")
    root = ctx.target.comfyui_root
    if root is None:
        return CheckResult(name, Outcome.SKIP, "the target has no ComfyUI")
    root, (width, height) = Path(root), size
    longest, pixels = max(width, height), width * height
    scan = resolution.scan_resolution_caps(root, longest)
    following, tiles = core_nodes(root, scan)
    failures, notes = [], []
    numbers = {"size": f"{width}x{height}", "pixels": pixels, "tile_inputs": tiles}
    try:
        found = resolution.read_max_resolution(root / "nodes.py")
    except (OSError, ApplierError) as exc:
        return CheckResult(name, Outcome.FAIL, f"cannot read nodes.py: {getattr(exc, 'message', None) or exc}")
    where = f"nodes.py:{found.line}" if found.line else "nodes.py"
    nodes = [f"{node} ({at})" for node, at in following.items()]
    numbers.update({"max_resolution": found.value, "max_resolution_where": where, "core_nodes": nodes})
    if found.value is not None and longest > found.value:
        patch, _ = ctx.max_resolution_patch()
        fix = f" [applier apply --only {patch.id}]" if patch else ""
        failures.append(f"MAX_RESOLUTION {found.value} ({where}) is below {longest}: {len(nodes)} core node(s) take "
                        f"it as their width/height max and refuse the size, {_shown(nodes)}{fix}")
    bound, bound_where = _pillow(ctx, root, found.value, notes)
    if bound_where == "raised in nodes.py":
        notes.clear()   # Pillow's own default no longer decides
    numbers.update({"pillow_max_image_pixels": bound, "pillow_where": bound_where})
    if bound is not None and pixels > 2 * bound:
        fix = f" [applier apply --only {PIL_PATCH}]" if ctx.patch(PIL_PATCH) else ""
        load = _class_line(root, "LoadImage") or "nodes.py"
        failures.append(f"Pillow's bound {bound:,} ({bound_where}) is below the size: LoadImage ({load}) refuses a "
                        f"{width}x{height} image ({pixels:,} pixels; DecompressionBombError above "
                        f"{2 * bound:,}){fix}")
    caps = [c for c in scan.caps if c.value < side_of(c, width, height)]
    listed = [f"{c.file}:{c.line} {c.node or '(module)'} {c.what} {c.value}" for c in caps]
    numbers.update({"node_caps": listed, "files_scanned": scan.files_scanned, "limits": scan.limits,
                    "skipped": [f"{path}: {why}" for path, why in scan.skipped], "notes": notes})
    if failures:
        more = f"; also {len(listed)} hard-coded node cap(s): {_shown(listed)}" if listed else ""
        return CheckResult(name, Outcome.FAIL, "; ".join(failures) + more, numbers)
    warnings = [f"{len(listed)} hard-coded cap(s) below {width}x{height}, each refusing it where a workflow uses "
                f"its node: {_shown(listed)}"] if listed else []
    if scan.skipped:
        warnings.append(resolution._skipped_words(scan.skipped))
    warnings += [f"scan bounded: {limit}" for limit in scan.limits] + notes
    tiled = f"; tiled VAE nodes take the canvas whole ({_shown(tiles)} bound a tile)" if tiles else ""
    if warnings:
        return CheckResult(name, Outcome.WARN, "; ".join(warnings) + tiled, numbers)
    return CheckResult(name, Outcome.PASS, f"nothing below {width}x{height}: MAX_RESOLUTION {found.value} ({where}), "
                                           f"Pillow {bound if bound is None else f'{bound:,}'} ({bound_where}), "
                                           f"no hard-coded cap in {scan.files_scanned} files{tiled}", numbers)


def _pillow(ctx, root: Path, max_resolution: int | None, notes: list) -> tuple[int | None, str]:
    """Pillow's bound once nodes.py has run, as `applier budget` reads it (applier.budget.caps)."""
    from applier.budget.caps import pillow_bound
    from applier.budget.data import load_budget_data
    default = load_budget_data().measured.pillow_max_image_pixels
    return pillow_bound(ctx.target, root, max_resolution, default, resolution, notes)


def _class_line(root: Path, name: str) -> str | None:
    data, _ = resolution.read_scanned(root / "nodes.py", Path(os.path.realpath(root)))
    try:
        tree = ast.parse(data or b"")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return next((f"nodes.py:{start}" for start, _, found in resolution.class_spans(tree) if found == name), None)
