"""Overlay packs: a Python package copied into the target's site-packages and a ComfyUI custom node copied into
custom_nodes/, every file recorded (relative to its root) in `.applier/overlays.json` so uninstall removes exactly
those. Install and uninstall are one journal transaction each: files, manifest and emptied folders together."""
from __future__ import annotations

import re
import time
from pathlib import Path

from applier import __version__
from applier.catalog import load_catalog
from applier.catalog.allowlist import store_for
from applier.catalog.packmeta import pack_files, pack_prefixes, read_pack
from applier.errors import DriftError, IOFailure, RefusedError, StateCorruptError
from applier.pack.node_pack import find_copies
from applier.resources import OVERLAYS_DIR
from applier.store import journal
from applier.store.confine import REPAIR_HINT, OverlayPrefixes, Place
from applier.store.fsutil import MAX_READ_BYTES, sha256_bytes
from applier.store.install import Install
from applier.store.journal import FileOp
from applier.store.applied import SHA256, check_format
from applier.store.state import StateStore, read_state_document
from applier.target import Target

def planned_files(target: Target, pack_dir: Path, meta: dict) -> list[tuple[Path, bytes]]:
    """(destination, bytes) of every file of the pack: the package into the environment's own site-packages (its
    purelib, never a parent environment's that --system-site-packages shows it), the node into custom_nodes/."""
    if target.purelib is None:
        if target.site_packages_problem:
            raise RefusedError(f"refusing to install the overlay package: {target.site_packages_problem}",
                               hint="applier never writes through a link leading out of the install; `applier "
                                    "detect` says what to do (--python naming that environment where it is)")
        raise RefusedError("the target has no Python environment to install the overlay package into",
                           hint="use --python PATH")
    out = []
    package_src = pack_dir / meta["package"]
    for src in pack_files(package_src):
        out.append((target.purelib / meta["package"] / src.relative_to(package_src), src.read_bytes()))
    if target.comfyui_root is not None:
        node_src = pack_dir / meta["node"]
        for src in pack_files(node_src):
            out.append((target.comfyui_root / "custom_nodes" / meta["node"] / src.relative_to(node_src),
                        src.read_bytes()))
    return out


MANIFEST_FORMAT = 2


def install(opened: Install, pack_dir: Path = OVERLAYS_DIR, meta: dict | None = None) -> dict:
    """Install the pack of pack_dir (its metadata `meta`) into the install the command opened for a run, confined by
    prefixes(target, meta): every file, then the manifest naming them, in one journal run."""
    meta = meta or read_pack(pack_dir)
    store, target = opened.store, opened.target
    ours = manifest_hashes(store)
    # every destination checked once, before anything there is read (a link on the way out of the target is
    # exit 7), and carried from then on as a Place: reads and writes go through the root's held handle
    wanted = [(store.confinement.relative(p), d) for p, d in planned_files(target, pack_dir, meta)]
    refuse_foreign_folders(store, ours)
    refuse_second_copies(target, meta)
    files = [manifest_entry(p, sha256_bytes(d)) for p, d in wanted]
    ops = []
    for path, data in wanted:
        current = path.read(limit=MAX_READ_BYTES)
        if current is not None and path not in ours:
            raise RefusedError(f"{path} exists and was not installed by applier: refusing to overwrite it",
                               hint="move it aside, then install again")
        if current is not None and sha256_bytes(current) != ours[path]:
            raise DriftError(f"{path} was edited since the overlay was installed",
                             hint="`applier overlay uninstall --force` saves and removes it")
        if current != data:
            ops.append(FileOp(path, current, data))
    wanted_paths = {p for p, _ in wanted}
    for stale in sorted(set(ours) - wanted_paths, key=str):  # files an older pack had and this one does not
        current = stale.read(limit=MAX_READ_BYTES)
        if current is not None:
            ops.append(FileOp(stale, current, None))
    manifest = {"format": MANIFEST_FORMAT, "applier_version": __version__, "pack": meta["name"], "version": meta["version"],
                "package": meta["package"], "node": meta["node"],
                "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": files}
    # One transaction: the files and the manifest that names them land together, or an interrupted install
    # is finished by the next command (journal.recover).
    opened.execute(ops, opened.state, f"install overlay pack {meta['name']} {meta['version']}",
                   manifest_after=manifest, prune=pack_folders(store, [op.path for op in ops if op.new is None]))
    return {"pack": meta["name"], "version": meta["version"], "files": [str(p) for p, _ in wanted],
            "changed": len(ops), "roots": [str(p) for p in install_tops(target, meta)]}


def prefixes(target: Target, meta: dict | None = None) -> OverlayPrefixes:
    """The folders the overlay may touch, beside the catalog's files (the state it shares with `apply` names them):
    the pack's install folders. Without the pack's metadata (uninstall, list), the folders the manifest names, when
    they are plain package names: a crafted manifest can then at most name files of one package folder inside the
    target, and uninstall still removes only files whose bytes match the sha256 it records."""
    if meta is None:
        meta = manifest_pack(target.state_dir)
    return OverlayPrefixes(meta["package"], meta["node"]) if meta else pack_prefixes()


def overlay_store(target: Target, catalog: list | None) -> StateStore:
    """The target's state folder for a reading command (list), confined by prefixes(target) and the catalog
    (default: the packaged one)."""
    return store_for(target, load_catalog() if catalog is None else catalog, prefixes(target))


def manifest_pack(state_dir: Path) -> dict | None:
    """{"package", "node"} as the installed manifest names them; None when absent, not plain names, or not reached
    without a link (the state folder's own check then refuses the command, before anything is read there)."""
    try:
        data = read_state_document(Path(state_dir) / "overlays.json")
    except StateCorruptError:
        return None
    if not isinstance(data, dict):
        return None
    names = {key: data.get(key) for key in ("package", "node")}
    if all(isinstance(v, str) and PACKAGE_NAME.fullmatch(v) for v in names.values()):
        return names
    return None


PACKAGE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def install_tops(target: Target, meta: dict) -> list[Path]:
    tops = []
    if target.purelib is not None:
        tops.append(target.purelib / meta["package"])
    if target.comfyui_root is not None:
        tops.append(target.comfyui_root / "custom_nodes" / meta["node"])
    return tops


def manifest_entry(place: Place, sha: str) -> dict:
    return {"root": place.root, "relpath": place.relpath, "sha256": sha}


def refuse_foreign_folders(store: StateStore, ours: dict[Place, str | None]) -> None:
    """RefusedError when an install folder of the pack exists, holds anything, and the manifest owns nothing in
    it: a folder of the pack's name that applier did not install (installed by ComfyUI-Manager or by hand, or the
    user's own) is never merged into, and so never pruned by a later uninstall."""
    for top in store.confinement.overlay_top_places():
        owned = any(p.root == top.root and p.relpath.startswith(top.relpath + "/") for p in ours)
        if owned:
            continue
        try:
            names = top.held.listdir(top.relpath)
        except (OSError, IOFailure):
            names = []
        if names:
            raise RefusedError(f"{top} exists and was not installed by applier (a pack installed another way, or "
                               "a folder of your own): refusing to install into it",
                               hint="move it aside (or remove it), then install again; `applier overlay check` "
                                    "reports on a pack installed by ComfyUI-Manager or git as it is")


def refuse_second_copies(target: Target, meta: dict) -> None:
    """RefusedError when the pack is already in custom_nodes/ under another folder name (a ComfyUI-Manager clone,
    a registry install): ComfyUI would load two copies of the same node."""
    if target.comfyui_root is None:
        return
    others = [copy for copy in find_copies(target.comfyui_root)
              if copy.folder.name != meta["node"] and not copy.disabled]
    if others:
        raise RefusedError(f"the node pack is already installed as {others[0].folder} ({others[0].source}): a "
                           "second copy would make ComfyUI load the same node twice",
                           hint="keep that one (`applier overlay check` reports on it), or remove it and run "
                                "`applier overlay install` again")


def pack_folders(store: StateStore, files: list) -> tuple[Place, ...]:
    """The folders holding files a run removes, up to the pack's install folder: those a run may remove once it
    left them empty (never a folder no file of the manifest was in)."""
    tops = {(t.root, t.relpath) for t in store.confinement.overlay_top_places()}
    folders = set()
    for place in files:
        parts = place.relpath.split("/")[:-1]
        while parts:
            rel = "/".join(parts)
            folders.add((place.root, rel))
            if (place.root, rel) in tops:
                break
            parts.pop()
    return tuple(store.confinement.resolve_dir(root, rel, what="this run") for root, rel in sorted(folders)
                 if store.confinement.overlay.allows(root, rel + "/"))


def read_manifest(store: StateStore) -> dict | None:
    """The overlay manifest, validated like the state (exit 7 when it was crafted or damaged); None when absent."""
    store.check_folder()
    data = store.read_json(store.overlay_manifest)
    if data is None:
        return None
    where = f"overlay manifest {store.overlay_manifest}"
    if not isinstance(data, dict):
        raise StateCorruptError(f"{where} is not a manifest this applier reads",
                                hint="inspect it by hand (plain JSON); nothing was changed")
    check_format(where, {**data, "format": data.get("format", 1)}, (1, MANIFEST_FORMAT),    # format 1 had none
                 hint="inspect it by hand (plain JSON); nothing was changed")
    if not isinstance(data.get("files", []), list):
        raise StateCorruptError(f"{where} is not a manifest this applier reads",
                                hint="inspect it by hand (plain JSON); nothing was changed")
    return data


def manifest_hashes(store: StateStore) -> dict[Place, str | None]:
    """{installed file: sha256 recorded at install} from the manifest, each path validated."""
    manifest = read_manifest(store) or {}
    where = f"overlay manifest {store.overlay_manifest}"
    out = {}
    for entry in manifest.get("files", []):
        if not isinstance(entry, dict):
            raise StateCorruptError(f"{where}: a file entry is not an object", hint=REPAIR_HINT)
        if "relpath" in entry:
            root, relpath = entry.get("root"), entry["relpath"]
            if not isinstance(root, str):
                raise StateCorruptError(f"{where}: a file entry lacks its root", hint=REPAIR_HINT)
        else:
            root, relpath = legacy_overlay_relative(entry.get("path"), store, where)
        sha = entry.get("sha256")
        if sha is not None and not (isinstance(sha, str) and SHA256.fullmatch(sha)):
            raise StateCorruptError(f"{where}: {relpath}: sha256 is not 64 hex digits", hint=REPAIR_HINT)
        out[store.confinement.resolve(root, relpath, what=where)] = sha
    return out


def legacy_overlay_relative(path, store: StateStore, where: str) -> tuple[str, str]:
    """Format 1 manifests kept absolute paths. Map one by the pack folder it names (…/site-packages/<package>/…,
    …/custom_nodes/<node>/…), so that a copied install maps onto its own files, never onto the original's."""
    if not isinstance(path, str):
        raise StateCorruptError(f"{where}: a file entry lacks its path", hint=REPAIR_HINT)
    parts = Path(path).parts
    overlay = store.confinement.overlay
    for root, marker in (("site-packages", (overlay.package,)), ("comfyui", ("custom_nodes", overlay.node))):
        if None in marker:
            continue
        for i in range(len(parts) - len(marker), -1, -1):
            if tuple(parts[i:i + len(marker)]) == marker:
                return root, "/".join(parts[i:])
    raise StateCorruptError(f"{where} names {path}, which is not a file of the overlay pack", hint=REPAIR_HINT)


def uninstall(opened: Install, *, force: bool = False) -> dict:
    """Remove exactly the files the manifest records, from the install the command opened for a run (create=False)
    and confined by prefixes(target); with force, files edited since install are saved under displaced/ first."""
    store = opened.store
    manifest = read_manifest(store) if opened.locked else None     # no .applier/: nothing installed
    if manifest is None:
        return {"removed": [], "displaced": None}
    ops, displaced = [], []
    files = manifest_hashes(store)
    for path, sha in files.items():
        current = path.read(limit=MAX_READ_BYTES)
        if current is None:
            continue
        if sha and sha256_bytes(current) != sha:
            if not force:
                raise DriftError(f"{path} was edited since the overlay was installed",
                                 hint="`--force` saves it under .applier/displaced/ and removes it")
            displaced.append((path, current))
        ops.append(FileOp(path, current, None))
    saved = store.save_displaced(displaced) if displaced else None
    # only folders that held a file of the manifest are removed, and only when the run left them empty
    opened.execute(ops, opened.state, f"uninstall overlay pack {manifest.get('pack')}",
                   manifest_after=None, prune=pack_folders(store, list(files)))
    return {"removed": [str(op.path) for op in ops], "displaced": str(saved) if saved else None}


def listing(target: Target, *, catalog: list | None = None) -> dict:
    store = overlay_store(target, catalog)
    recovered = journal.recover_if_pending(store)
    manifest = read_manifest(store)
    if not manifest or not manifest.get("files"):
        return {"installed": False, **({"recovered": recovered} if recovered else {})}
    intact = modified = missing = 0
    files = manifest_hashes(store)
    for path, expected in files.items():
        sha = path.sha256()
        if sha is None:
            missing += 1
        elif sha == expected:
            intact += 1
        else:
            modified += 1
    return {"installed": True, "pack": manifest.get("pack"), "version": manifest.get("version"),
            "intact": intact, "modified": modified, "missing": missing, "files": [str(p) for p in files],
            **({"recovered": recovered} if recovered else {})}
