"""Overlay packs: a Python package copied into the target's site-packages and a ComfyUI custom node copied into
custom_nodes/, every file recorded in `.applier/overlays.json` so uninstall removes exactly those."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from applier import journal
from applier.errors import DriftError, RefusedError
from applier.fsutil import atomic_write, read_bytes_or_none, sha256_bytes, sha256_file
from applier.journal import FileOp
from applier.lock import target_lock
from applier.resources import OVERLAYS_DIR
from applier.state import StateStore, dump_json, read_json
from applier.target import Target

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SKIP_PARTS = {"__pycache__", ".pytest_cache"}


def read_pack(pack_dir: Path = OVERLAYS_DIR) -> dict:
    meta = tomllib.loads((pack_dir / "pack.toml").read_text(encoding="utf-8"))
    for key in ("name", "version", "package", "node"):
        if key not in meta:
            raise RefusedError(f"{pack_dir / 'pack.toml'} lacks {key!r}")
    return meta


def pack_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not SKIP_PARTS & set(p.parts)
                  and p.suffix not in (".pyc", ".pyo"))


def planned_files(target: Target, pack_dir: Path, meta: dict) -> list[tuple[Path, bytes]]:
    if target.site_packages is None:
        raise RefusedError("the target has no Python environment to install the overlay package into",
                           hint="use --python PATH")
    out = []
    package_src = pack_dir / meta["package"]
    for src in pack_files(package_src):
        out.append((target.site_packages / meta["package"] / src.relative_to(package_src), src.read_bytes()))
    if target.comfyui_root is not None:
        node_src = pack_dir / meta["node"]
        for src in pack_files(node_src):
            out.append((target.comfyui_root / "custom_nodes" / meta["node"] / src.relative_to(node_src),
                        src.read_bytes()))
    return out


def install(target: Target, pack_dir: Path = OVERLAYS_DIR) -> dict:
    meta = read_pack(pack_dir)
    store = StateStore(target.state_dir)
    with target_lock(store.dir):
        journal.recover(store)
        manifest = read_json(store.overlay_manifest) or {"files": []}
        ours = {f["path"]: f["sha256"] for f in manifest.get("files", [])}
        wanted = planned_files(target, pack_dir, meta)
        ops = []
        for path, data in wanted:
            current = read_bytes_or_none(path)
            if current is not None and str(path) not in ours:
                raise RefusedError(f"{path} exists and was not installed by applier: refusing to overwrite it",
                                   hint="move it aside, then install again")
            if current is not None and sha256_bytes(current) != ours[str(path)]:
                raise DriftError(f"{path} was edited since the overlay was installed",
                                 hint="`applier overlay uninstall --force` saves and removes it")
            if current != data:
                ops.append(FileOp(path, current, data))
        wanted_paths = {str(p) for p, _ in wanted}
        for stale in sorted(set(ours) - wanted_paths):  # files an older pack had and this one does not
            current = read_bytes_or_none(Path(stale))
            if current is not None:
                ops.append(FileOp(Path(stale), current, None))
        files = [{"path": str(p), "sha256": sha256_bytes(d)} for p, d in wanted]
        new_hashes = {f["path"]: f["sha256"] for f in files}
        # The manifest names every file before any is written: an interrupted install can still be uninstalled.
        interim = {"pack": meta["name"], "version": meta["version"], "installing": True,
                   "files": [{"path": p, "sha256": new_hashes.get(p, ours.get(p))}
                             for p in sorted(set(new_hashes) | set(ours))]}
        write_manifest(store, interim)
        journal.execute(store, ops, store.load(), f"install overlay pack {meta['name']} {meta['version']}")
        final = {"pack": meta["name"], "version": meta["version"], "package": meta["package"],
                 "node": meta["node"], "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": files}
        write_manifest(store, final)
        roots = [str(target.site_packages / meta["package"])]
        if target.comfyui_root is not None:
            roots.append(str(target.comfyui_root / "custom_nodes" / meta["node"]))
        return {"pack": meta["name"], "version": meta["version"], "files": [f["path"] for f in files],
                "changed": len(ops), "roots": roots}


def write_manifest(store: StateStore, data: dict) -> None:
    store.dir.mkdir(parents=True, exist_ok=True)
    atomic_write(store.overlay_manifest, dump_json(data), mode=0o644)


def uninstall(target: Target, *, force: bool = False) -> dict:
    store = StateStore(target.state_dir)
    manifest = read_json(store.overlay_manifest)
    if not manifest or not manifest.get("files"):
        return {"removed": [], "displaced": None}
    with target_lock(store.dir):
        journal.recover(store)
        ops, displaced = [], []
        for entry in manifest["files"]:
            path = Path(entry["path"])
            current = read_bytes_or_none(path)
            if current is None:
                continue
            if entry.get("sha256") and sha256_bytes(current) != entry["sha256"]:
                if not force:
                    raise DriftError(f"{path} was edited since the overlay was installed",
                                     hint="`--force` saves it under .applier/displaced/ and removes it")
                displaced.append((path, current))
            ops.append(FileOp(path, current, None))
        saved = None
        if displaced:
            from applier.operations import save_displaced
            saved = save_displaced(store, displaced)
        journal.execute(store, ops, store.load(), f"uninstall overlay pack {manifest.get('pack')}")
        for op in ops:  # remove folders the install created, when now empty
            prune_empty(op.path.parent, stop_at=(target.site_packages, target.comfyui_root))
        store.overlay_manifest.unlink()
        return {"removed": [str(op.path) for op in ops], "displaced": str(saved) if saved else None}


def prune_empty(folder: Path, stop_at) -> None:
    stops = {Path(s) for s in stop_at if s is not None} | {Path(s) / "custom_nodes" for s in stop_at if s}
    while folder not in stops and folder.is_dir():
        pycache = folder / "__pycache__"
        if pycache.is_dir() and all(p.suffix == ".pyc" for p in pycache.iterdir()):
            for p in pycache.iterdir():
                p.unlink()
            pycache.rmdir()
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def listing(target: Target) -> dict:
    manifest = read_json(StateStore(target.state_dir).overlay_manifest)
    if not manifest or not manifest.get("files"):
        return {"installed": False}
    intact = modified = missing = 0
    for entry in manifest["files"]:
        sha = sha256_file(Path(entry["path"]))
        if sha is None:
            missing += 1
        elif sha == entry.get("sha256"):
            intact += 1
        else:
            modified += 1
    return {"installed": True, "pack": manifest.get("pack"), "version": manifest.get("version"),
            "intact": intact, "modified": modified, "missing": missing,
            "interrupted": bool(manifest.get("installing")), "files": [e["path"] for e in manifest["files"]]}
