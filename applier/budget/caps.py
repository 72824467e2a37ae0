"""The target's caps on image size, read from its files for `applier budget` (never imported, never run).

MAX_RESOLUTION and the hard-coded caps come from the verify suite's own readers (verify/checks/resolution.py:
read_max_resolution, scan_resolution_caps), so `budget` and `verify` see the same numbers. Pillow's bound is read
from the target's PIL/Image.py (MAX_IMAGE_PIXELS) and from a module-level assignment to `*.MAX_IMAGE_PIXELS` in
nodes.py (what comfyui/pil-pixel-limit adds), evaluated with the values read before it.
"""
from __future__ import annotations

import ast
import importlib
import shlex
from pathlib import Path

from applier.budget.records import Cap, TargetCaps
from applier.errors import ApplierError
from applier.resources import load_verify
from applier.store.fsutil import read_inside, read_inside_or_none
from applier.target import Target

MAX_PIL_IMAGE_PY_BYTES = 4 * 1024 * 1024      # Pillow's Image.py is ~150 kB
PIL_IMAGE = Path("PIL") / "Image.py"
UNSET = object()


def resolution_readers():
    """verify/checks/resolution.py, as the verify suite loads it (one copy of the readers)."""
    load_verify()
    return importlib.import_module("applier_verify.checks.resolution")


def read_target_caps(target: Target, longest_side: int, pillow_default: int) -> TargetCaps | None:
    """What the target's files allow; None when the target has no ComfyUI folder."""
    root = target.comfyui_root
    if root is None:
        return None
    resolution = resolution_readers()
    root = Path(root)
    notes = []
    try:
        found = resolution.read_max_resolution(root / "nodes.py")
        max_resolution = found.value
        where = f"nodes.py:{found.line}" if found.line else "nodes.py (no MAX_RESOLUTION assignment)"
    except (OSError, ApplierError) as exc:
        max_resolution, where = None, f"nodes.py not read: {getattr(exc, 'message', None) or exc}"
    pillow, pillow_where = pillow_bound(target, root, max_resolution, pillow_default, resolution, notes)
    scan = resolution.scan_resolution_caps(root, longest_side)
    caps = tuple(Cap(f"{c.file}:{c.line}", c.value, c.what, c.node) for c in scan.caps)
    if scan.skipped:
        notes.append(f"{len(scan.skipped)} file(s) not scanned for caps: "
                     + ", ".join(f"{path} ({why})" for path, why in scan.skipped[:5]))
    return TargetCaps(max_resolution, where, pillow, pillow_where, caps, tuple(notes), shlex.quote(str(target.root)))


def pillow_bound(target: Target, root: Path, max_resolution: int | None, default: int, resolution,
                 notes: list) -> tuple[int | None, str]:
    """(MAX_IMAGE_PIXELS once nodes.py has run, where that comes from); None means no bound at all."""
    int_value = resolution.int_value
    bound, where = default, "Pillow's default"
    site = target.site_packages
    data = None
    if site is not None:
        try:
            data = read_inside_or_none(Path(site), Path(site) / PIL_IMAGE, limit=MAX_PIL_IMAGE_PY_BYTES)
        except ApplierError as exc:
            notes.append(f"{PIL_IMAGE.as_posix()} not read: {exc.message}")
    if data is None:
        notes.append("Pillow not found in the target's environment: its default bound assumed")
    else:
        value = _module_assignment(data, lambda node: _evaluate(node, int_value, {}))
        if value is not UNSET:
            bound, where = value, f"{PIL_IMAGE.as_posix()} in the target's site-packages"
    try:
        nodes = read_inside(root, root / "nodes.py", limit=resolution.MAX_NODES_PY_BYTES)
    except (OSError, ApplierError):
        return bound, where
    names = {"MAX_RESOLUTION": max_resolution, "MAX_IMAGE_PIXELS": bound}
    raised = _module_assignment(nodes, lambda node: _evaluate(node, int_value, names))
    if raised is not UNSET:
        return raised, "raised in nodes.py"
    return bound, where


def _module_assignment(source: bytes, evaluate):
    """The value of the last module-level `MAX_IMAGE_PIXELS = ...` or `X.MAX_IMAGE_PIXELS = ...` (also inside a
    top-level `if`), evaluated; UNSET when there is none or it cannot be evaluated."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return UNSET
    found = UNSET
    statements = list(tree.body)
    for statement in list(statements):
        if isinstance(statement, ast.If):
            statements += statement.body
    for statement in sorted(statements, key=lambda s: s.lineno):
        if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            if any(_name_of(t) == "MAX_IMAGE_PIXELS" for t in targets):
                value = evaluate(statement.value)
                if value is not UNSET:
                    found = value
    return found


def _name_of(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _evaluate(node: ast.AST, int_value, names: dict):
    """An integer expression over constants, the names given, int() and max()/min(); None for a literal None."""
    if isinstance(node, ast.Constant) and node.value is None:
        return None
    known = _name_of(node)
    if known in names and isinstance(node, (ast.Name, ast.Attribute)):
        return names[known] if names[known] is not None else UNSET
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        values = [_evaluate(arg, int_value, names) for arg in node.args]
        if any(v is UNSET or v is None for v in values) or not values:
            return UNSET
        if node.func.id == "int" and len(values) == 1:
            return int(values[0])
        if node.func.id in ("max", "min"):
            return (max if node.func.id == "max" else min)(values)
        return UNSET
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, int_value, names), _evaluate(node.right, int_value, names)
        if not isinstance(left, int) or not isinstance(right, int):
            return UNSET
        return int_value(ast.BinOp(ast.Constant(left), node.op, ast.Constant(right)))
    value = int_value(node)
    return UNSET if value is None else value
