"""ComfyUI prestartup script: warn when a ComfyUI update undid patches that `applier` applied.

Runs before torch and nodes.py are imported, and must never stop ComfyUI from starting. It reads the state exactly
where applier writes it: `<install root>/.applier/state.json`, the install root being the outer folder of a
Windows-portable install (ComfyUI's parent holds `python_embeded/`) and the ComfyUI folder otherwise.

State format 2 stores each file as a "relpath" relative to its component's root; only "comfyui" files (relative to
the ComfyUI folder) are checked here, as the target's site-packages is unknown to this script. Format 1's absolute
"path" is accepted where a file has no relpath. A relpath that is absolute (a drive letter too), climbs out with
"..", or resolves outside the ComfyUI folder is not read. A missing or unreadable state means nothing to say.
Prints one line to stderr naming the patches whose files no longer hash to what applier wrote last into them:
"lost by an update" when a file is back at its original bytes (or the state does not say), "edited" when it holds
other bytes (an edit by hand, or an update that changed the file): `applier status` then names the ways out. Files
are read without blocking and only when they are regular files of a bounded size (a FIFO must not hang ComfyUI).
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
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


MAX_BYTES = 64 * 1024 * 1024


def _read_regular(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
            return None
        with os.fdopen(os.dup(fd), "rb") as handle:
            return handle.read(MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def _sha256(path: Path) -> str | None:
    data = _read_regular(path)
    return None if data is None else hashlib.sha256(data).hexdigest()


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


def changed_patches(comfyui: Path) -> dict[str, str]:
    """{id: "lost" | "edited"} of applied patches with a file whose bytes no longer hash to what applier wrote last
    into it (two patches may edit one file, e.g. nodes.py: the later one, by "seq", holds the file's expected
    hash). "lost": every such file is back at its original bytes, or the state does not record them."""
    try:
        raw = _read_regular(install_root(comfyui) / ".applier" / "state.json")
        if raw is None:
            return {}
        state = json.loads(raw.decode("utf-8"))
        records = sorted(state.get("applied", {}).items(), key=lambda item: item[1].get("seq", 0))
        checked: list[tuple[str, list[Path]]] = []
        expected: dict[Path, object] = {}
        original: dict[Path, object] = {}
        for patch_id, record in records:
            component = record.get("component", "comfyui")
            files = []
            for entry in record.get("files", []):
                path = _file_of(entry, component, comfyui)
                if path is not None:
                    files.append(path)
                    expected[path] = entry.get("sha256_after")
                    original.setdefault(path, entry.get("sha256_before", None))
            checked.append((str(patch_id), files))
    except (OSError, ValueError, AttributeError, TypeError, KeyError, RecursionError):
        return {}
    out = {}
    for patch_id, files in checked:
        changed = [p for p in files if _sha256(p) != expected[p]]
        if changed:
            edited = any(original[p] is not None and _sha256(p) not in (original[p], None) for p in changed)
            out[patch_id] = "edited" if edited else "lost"
    return out


def lost_patches(comfyui: Path) -> list[str]:
    """Ids of applied patches whose files no longer hold what applier wrote (lost or edited)."""
    return list(changed_patches(comfyui))


def warn_if_lost(comfyui: Path, stream=None) -> list[str]:
    changed = changed_patches(comfyui)
    lost = sorted(k for k, v in changed.items() if v == "lost")
    edited = sorted(k for k, v in changed.items() if v == "edited")
    root = install_root(comfyui)
    parts = []
    if lost:
        parts.append(f"patches lost by an update: {', '.join(lost)}; run applier apply --target {root}")
    if edited:
        parts.append(f"patched files edited since apply: {', '.join(edited)}; run applier status --target {root} "
                     "(keep the edit with applier accept, or revert)")
    if parts:
        print("[applier] " + "; ".join(parts), file=stream or sys.stderr)
    return list(changed)


try:
    warn_if_lost(comfyui_root())
except Exception:  # a prestartup script must never stop ComfyUI from starting
    pass
