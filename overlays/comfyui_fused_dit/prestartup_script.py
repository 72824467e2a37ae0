"""ComfyUI prestartup script: warn when a ComfyUI update undid patches that `applier` applied.

Runs before torch and nodes.py are imported. Reads `<ComfyUI root>/.applier/state.json` (plain JSON written by
applier: {"applied": {patch_id: {"files": [{"path": ..., "sha256_after": ...}]}}}); a missing or unreadable
state file means nothing to say. Prints one line to stderr naming the patches whose files no longer match.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def comfyui_root() -> Path:
    # <root>/custom_nodes/comfyui_fused_dit/prestartup_script.py
    return Path(__file__).resolve().parents[2]


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def lost_patches(root: Path) -> list[str]:
    """Ids of applied patches with a file whose bytes no longer hash to what applier wrote last into it (two
    patches may edit one file, e.g. nodes.py: the later one, by "seq", holds the file's expected hash)."""
    try:
        state = json.loads((root / ".applier" / "state.json").read_text(encoding="utf-8"))
        records = sorted(state.get("applied", {}).items(), key=lambda item: item[1].get("seq", 0))
        expected = {f["path"]: f["sha256_after"] for _, rec in records for f in rec.get("files", [])}
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return []
    lost = []
    for patch_id, rec in records:
        if any(_sha256(Path(f["path"])) != expected.get(f["path"]) for f in rec.get("files", []) if "path" in f):
            lost.append(str(patch_id))
    return lost


def warn_if_lost(root: Path, stream=None) -> list[str]:
    lost = lost_patches(root)
    if lost:
        print(f"[applier] patches lost by an update: {', '.join(sorted(lost))}; "
              f"run applier apply --target {root}", file=stream or sys.stderr)
    return lost


try:
    warn_if_lost(comfyui_root())
except Exception:  # a prestartup script must never stop ComfyUI from starting
    pass
