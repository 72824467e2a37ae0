"""The overlay pack's metadata (`overlays/pack.toml`): its name, version, package and node folder names.

It lives in the catalog, beside the patches' metadata, because the allow-list (allowlist.py) needs the pack's
folders; the installer in applier/pack/ reads it from here."""
from __future__ import annotations

import sys
from pathlib import Path

from applier.errors import ApplierError, RefusedError
from applier.resources import OVERLAYS_DIR
from applier.store.confine import OverlayPrefixes

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


SKIP_PARTS = {"__pycache__", ".pytest_cache"}


def pack_files(folder: Path) -> list[Path]:
    """The pack's files below folder: sources and data, never bytecode or caches."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and not SKIP_PARTS & set(p.parts)
                  and p.suffix not in (".pyc", ".pyo"))


def read_pack(pack_dir: Path = OVERLAYS_DIR) -> dict:
    meta_path = pack_dir / "pack.toml"
    try:
        meta = tomllib.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RefusedError(f"cannot read the overlay pack's {meta_path}: {exc}",
                           hint="this applier install lacks its overlay pack") from exc
    for key in ("name", "version", "package", "node"):
        if not isinstance(meta.get(key), str) or not meta[key]:
            raise RefusedError(f"{meta_path} lacks {key!r} (a string)")
    return meta


def pack_prefixes(pack_dir: Path = OVERLAYS_DIR) -> OverlayPrefixes:
    """The packaged overlay pack's install folders; none when the pack is absent from this install."""
    try:
        meta = read_pack(pack_dir)
    except (ApplierError, OSError, ValueError):
        return OverlayPrefixes()
    package, node = meta.get("package"), meta.get("node")
    return OverlayPrefixes(package if plain_name(package) else None, node if plain_name(node) else None)


def plain_name(name) -> bool:
    return isinstance(name, str) and bool(name) and "/" not in name and name not in (".", "..")
