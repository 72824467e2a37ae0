"""The whole catalog: every patch under `patches/` (or `--patches DIR`), their `requires` resolved, and the patches a
command acts on (--only, --skip).
"""
from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

from applier.catalog.patch import COMPONENTS, FORMAT_DOC, CatalogError, Patch, stat_or_none
from applier.catalog.patch_toml import load_patch
from applier.errors import RefusedError
from applier.resources import PATCHES_DIR
from applier.store.fsutil import kind_of


def _patch_folders(comp_dir: Path) -> list[Path]:
    """The folders of one component that hold a patch.toml (of any kind: load_patch refuses one that is not a
    regular file), sorted. A folder without patch.toml is not a patch; an entry that cannot be looked at, or a
    component that is not a folder, is a CatalogError, never a patch silently left out."""
    looking_at = comp_dir
    try:
        seen = stat_or_none(comp_dir)
        if seen is None:
            return []
        if not stat.S_ISDIR(seen.st_mode):
            kind = "a file" if stat.S_ISREG(seen.st_mode) else kind_of(seen.st_mode)
            raise CatalogError(f"catalog folder {comp_dir} is {kind}, not a folder of patches",
                               hint=f"expected {comp_dir}/<name>/patch.toml ({FORMAT_DOC})")
        folders = []
        for name in sorted(os.listdir(comp_dir)):
            looking_at = folder = comp_dir / name
            entry = stat_or_none(folder)
            if entry is None and os.path.islink(folder):
                raise CatalogError(f"{folder} is a link to nothing", hint="remove it, or point it at a patch folder")
            if entry is None or not stat.S_ISDIR(entry.st_mode):
                continue            # a README, a stray file: not a patch (and never opened)
            looking_at = folder / "patch.toml"
            if stat_or_none(looking_at, follow_links=False) is not None:    # any kind: load_patch says
                folders.append(folder)
    except OSError as exc:
        raise CatalogError(f"{looking_at} cannot be read: {exc.strerror or exc}",
                           hint="give the user running applier access to the whole catalog folder") from exc
    return folders


def load_catalog(root: Path | None = None) -> list[Patch]:
    """Every patch under root (default: the packaged patches/), sorted by id. A folder with no patch at all is an
    error (a mistyped `--patches` must not look like an empty catalog)."""
    root = Path(root) if root is not None else PATCHES_DIR
    if not root.is_dir():
        raise CatalogError(f"catalog folder {root} does not exist",
                           hint=f"--patches takes a folder laid out like the packaged catalog ({FORMAT_DOC})")
    patches = []
    for component in COMPONENTS:
        patches += [load_patch(folder, component) for folder in _patch_folders(root / component)]
    if not patches:
        raise CatalogError(f"catalog folder {root} holds no patch",
                           hint=f"expected {root}/<{'|'.join(COMPONENTS)}>/<name>/patch.toml ({FORMAT_DOC})")
    by_id = {p.id: p for p in patches}
    for patch in patches:
        for required in patch.requires:
            if required not in by_id or required == patch.id:
                raise CatalogError(f"{patch.folder / 'patch.toml'}: 'requires' names {required!r}, "
                                   "which is not another patch of the catalog")
    return [replace(p, required=tuple(by_id[r] for r in p.requires)) if p.requires else p for p in patches]


def select_patches(catalog: list[Patch], only: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> list[Patch]:
    """The patches a command acts on: --only (exact ids or a component name), minus --skip."""
    by_id = {p.id: p for p in catalog}
    for wanted in (*only, *skip):
        if wanted not in by_id and wanted not in COMPONENTS:
            raise RefusedError(f"no patch {wanted!r} in the catalog",
                               hint=f"known: {', '.join(sorted(by_id))}")

    def matches(patch: Patch, names: tuple[str, ...]) -> bool:
        return patch.id in names or patch.component in names

    chosen = [p for p in catalog if matches(p, only)] if only else [p for p in catalog if p.default]
    return [p for p in chosen if not matches(p, skip)]
