"""ComfyUI prestartup script: warn when a ComfyUI update undid patches that `applier` applied.

Runs before torch and nodes.py are imported, and must never stop ComfyUI from starting. It reads the state exactly
where applier writes it: `<install root>/.applier/state.json`, the install root being the outer folder of a
Windows-portable install (ComfyUI's parent holds `python_embeded/`) and the ComfyUI folder otherwise.

State format 2 stores each file as a "relpath" relative to its component's root; only "comfyui" files (relative to
the ComfyUI folder) are checked here, as the target's site-packages is unknown to this script. Format 1's absolute
"path" is accepted where a file has no relpath. A relpath that is absolute (a drive letter too), climbs out with
"..", or resolves outside the ComfyUI folder is not read. A missing or unreadable state means nothing to say.
Prints one line to stderr naming the patches whose files no longer hash to what applier wrote last into them.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path, PurePosixPath, PureWindowsPath

EMBEDDED_PYTHON = "python_embeded"      # the portable build's spelling


def comfyui_root() -> Path:
    # <ComfyUI>/custom_nodes/comfyui_fused_dit/prestartup_script.py
    return Path(__file__).resolve().parents[2]


def install_root(comfyui: Path) -> Path:
    """Where applier keeps .applier/ for this ComfyUI folder: a portable install's outer folder, else the folder."""
    outer = comfyui.parent
    return outer if (outer / EMBEDDED_PYTHON).is_dir() else comfyui


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _file_of(entry, component, comfyui: Path) -> Path | None:
    """The file a state entry names, or None where this script cannot or must not check it."""
    if not isinstance(entry, dict):
        return None
    relpath = entry.get("relpath")
    if relpath is None:                     # format 1 without a relpath: its absolute path
        path = entry.get("path")
        return Path(path) if isinstance(path, str) and Path(path).is_absolute() else None
    if component != "comfyui" or not isinstance(relpath, str) or not relpath:
        return None
    parts = PurePosixPath(relpath.replace("\\", "/"))
    if parts.is_absolute() or ".." in parts.parts or PureWindowsPath(relpath).anchor:
        return None
    path = comfyui / Path(*parts.parts)
    try:
        path.resolve().relative_to(comfyui.resolve())
    except (OSError, ValueError):
        return None
    return path


def lost_patches(comfyui: Path) -> list[str]:
    """Ids of applied patches with a file whose bytes no longer hash to what applier wrote last into it (two
    patches may edit one file, e.g. nodes.py: the later one, by "seq", holds the file's expected hash)."""
    try:
        state = json.loads((install_root(comfyui) / ".applier" / "state.json").read_text(encoding="utf-8"))
        records = sorted(state.get("applied", {}).items(), key=lambda item: item[1].get("seq", 0))
        checked: list[tuple[str, list[Path]]] = []
        expected: dict[Path, object] = {}
        for patch_id, record in records:
            component = record.get("component", "comfyui")
            files = []
            for entry in record.get("files", []):
                path = _file_of(entry, component, comfyui)
                if path is not None:
                    files.append(path)
                    expected[path] = entry.get("sha256_after")
            checked.append((str(patch_id), files))
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return []
    return [patch_id for patch_id, files in checked if any(_sha256(p) != expected[p] for p in files)]


def warn_if_lost(comfyui: Path, stream=None) -> list[str]:
    lost = lost_patches(comfyui)
    if lost:
        print(f"[applier] patches lost by an update: {', '.join(sorted(lost))}; "
              f"run applier apply --target {install_root(comfyui)}", file=stream or sys.stderr)
    return lost


try:
    warn_if_lost(comfyui_root())
except Exception:  # a prestartup script must never stop ComfyUI from starting
    pass
