"""Path safety: every path a diff names must stay inside its component root, checked before any write."""
from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from applier.errors import UnsafePathError

STATE_DIR_NAME = ".applier"     # a target's state folder: no diff may write into it


def real_inside(top: Path, path: Path) -> bool:
    """Whether path, every link on its way followed, still lies inside top (top itself counts), top's own links
    followed too. A path that does not exist yet is judged by the folders that do: realpath resolves what exists."""
    top_real = Path(os.path.realpath(top))
    real = Path(os.path.realpath(path))
    return real == top_real or top_real in real.parents


def resolve_inside(root: Path, relpath: str, *, patch_id: str = "") -> Path:
    """The absolute path of `relpath` under `root`; UnsafePathError for absolute paths, `..`, drive letters,
    or a symlink (anywhere on the way) that leads outside root."""
    where = f"{patch_id}: " if patch_id else ""
    if not relpath or "\x00" in relpath:
        raise UnsafePathError(f"{where}empty or invalid path in diff: {relpath!r}")
    if relpath.startswith(("/", "\\")) or (len(relpath) > 1 and relpath[1] == ":"):
        raise UnsafePathError(f"{where}absolute path in diff refused: {relpath}")
    parts = PurePosixPath(relpath.replace("\\", "/")).parts
    if any(part == ".." for part in parts):
        raise UnsafePathError(f"{where}path with '..' in diff refused: {relpath}")
    if STATE_DIR_NAME in parts:
        raise UnsafePathError(f"{where}{relpath} lies inside applier's own state folder {STATE_DIR_NAME}/ - "
                              "refused")
    root_real = Path(os.path.realpath(root))
    candidate = Path(os.path.realpath(root_real.joinpath(*parts)))
    if candidate != root_real and root_real not in candidate.parents:
        raise UnsafePathError(f"{where}{relpath} resolves to {candidate}, outside {root_real} (symlink escape) - "
                              "refused")
    if STATE_DIR_NAME in candidate.relative_to(root_real).parts:
        raise UnsafePathError(f"{where}{relpath} resolves into applier's own state folder {STATE_DIR_NAME}/ - "
                              "refused")
    return root_real.joinpath(*parts)
