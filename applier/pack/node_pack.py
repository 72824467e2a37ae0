"""The overlay pack as ComfyUI installs node packs: one self-contained folder, written by `applier overlay export`
and found again under a ComfyUI's custom_nodes/ whoever put it there (ComfyUI-Manager, `comfy node install`, git).

The folder holds the node's files (overlays/<node>/: __init__.py, prestartup_script.py and pyproject.toml, the Comfy
Registry's [project] / [tool.comfy] metadata) at its top and the kernels package beside them (<package>/, a copy of
overlays/<package>/), which the node's __init__.py loads from there when it is present. These are the bytes
`applier overlay install` writes into custom_nodes/<node>/ and site-packages/<package>/, so both routes give the
same node; the folder needs no pip step (torch, and Triton where a CUDA build of torch brings it, are ComfyUI's).
"""
from __future__ import annotations

import json
import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from applier.catalog.packmeta import pack_files, read_pack
from applier.errors import ApplierError, RefusedError
from applier.resources import OVERLAYS_DIR
from applier.store.fsutil import MAX_WALK_DEPTH, MAX_WALK_ENTRIES, read_inside_or_none
from applier.store.heldroot import hold
from applier.store.staged import write_folder
from applier.strenum import StrEnum

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REGISTRY_FILE = "pyproject.toml"


class Installer(StrEnum):
    """Who put a copy of the node pack under custom_nodes/ (its JSON "source" and "installed_by")."""
    APPLIER = "applier"         # `applier overlay install`: the folder its overlay manifest names
    GIT = "git"                 # a git clone: ComfyUI-Manager's "Install via Git URL", or git by hand
    REGISTRY = "registry"       # the Comfy Registry's archive: ComfyUI-Manager or `comfy node install`
    COPIED = "copied"           # none of those marks: copied in by hand


# what ComfyUI-Manager leaves in a folder it installed: a git clone ("Install via Git URL") or the Comfy Registry's
# archive, which it marks with a .tracking file listing the archive's files (as comfy-cli's `comfy node install`)
SOURCE_MARKERS = ((".git", Installer.GIT), (".tracking", Installer.REGISTRY))
DISABLED_SUFFIX = ".disabled"           # ComfyUI skips a custom_nodes entry named so (ComfyUI-Manager's "disable")
# the two registry fields a publisher fills at export (the registry requires both to publish; loading needs neither)
FILLED_AT_EXPORT = {"publisher": "PublisherId", "repository": "Repository"}
# the Comfy Registry's own rule for a publisher id (registry-backend, mapper/publisher.go: IsValidPublisherID)
PUBLISHER_ID = re.compile(r"[a-z][a-z0-9-]*")


def registry_metadata(pack_dir: Path = OVERLAYS_DIR) -> dict:
    """The node folder's pyproject.toml, parsed (its [project] name is the pack's id on the Comfy Registry)."""
    meta = read_pack(pack_dir)
    path = pack_dir / meta["node"] / REGISTRY_FILE
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RefusedError(f"cannot read the node pack's {path}: {exc}",
                           hint="this applier install lacks its overlay pack") from exc
    if not isinstance(data.get("project", {}).get("name"), str):
        raise RefusedError(f"{path} lacks [project] name")
    return data


def standalone_files(pack_dir: Path = OVERLAYS_DIR) -> dict[str, bytes]:
    """{path inside the standalone folder: bytes}: the node folder's files at the top, the package under its name."""
    meta = read_pack(pack_dir)
    out = {}
    for folder, prefix in ((pack_dir / meta["node"], ""), (pack_dir / meta["package"], meta["package"] + "/")):
        for src in pack_files(folder):
            out[prefix + src.relative_to(folder).as_posix()] = src.read_bytes()
    return out


def registry_field_problems(publisher: str | None = None, repository: str | None = None) -> dict[str, str]:
    """{option: what is wrong} for the two fields the registry would refuse; empty when both may be published."""
    problems = {}
    if publisher is not None and not PUBLISHER_ID.fullmatch(publisher):
        problems["publisher"] = (f"{publisher!r} is not a Comfy Registry publisher id: lowercase letters, digits "
                                 "and hyphens, starting with a letter (the id after the @ on your registry profile)")
    if repository is not None:
        try:
            parts = urlsplit(repository)
        except ValueError:          # e.g. an unclosed [ in the host
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or any(
                c.isspace() or not c.isprintable() or c in "\"<>\\" for c in repository):
            problems["repository"] = (f"{repository!r} is not a repository URL: give the http(s) address of its "
                                      "page, e.g. https://github.com/OWNER/REPO")
    return problems


def fill_registry_fields(text: str, **values: str | None) -> str:
    """pyproject.toml's text with `PublisherId = ""` / `Repository = ""` filled (values quoted as TOML strings)."""
    for option, key in FILLED_AT_EXPORT.items():
        value = values.get(option)
        if value:
            text, count = re.subn(rf'(?m)^{key} = ""$', f"{key} = {json.dumps(value)}", text)
            if count != 1:
                raise RefusedError(f"the node's {REGISTRY_FILE} has no empty `{key} = \"\"` line to fill")
    return text


def export(dest: Path, pack_dir: Path = OVERLAYS_DIR, *, publisher: str | None = None,
           repository: str | None = None) -> dict:
    """Write the standalone node folder to dest: a new or empty folder, or an earlier export of this pack (a clone
    of the pack's repository: its .git and any file not of the pack stay; package files the pack no longer has go).
    All or nothing (store/staged.py): written beside dest first, then moved into place; a failure leaves dest as
    it was, and the staging folder an interrupted export left is removed by the next one."""
    dest = Path(dest)
    meta = read_pack(pack_dir)
    name = registry_metadata(pack_dir)["project"]["name"]
    problems = registry_field_problems(publisher, repository)
    if problems:            # the CLI refuses these as usage errors first; a caller of export() meets them here
        raise RefusedError("; ".join(problems.values()), hint="nothing was written")
    files = standalone_files(pack_dir)
    files[REGISTRY_FILE] = fill_registry_fields(files[REGISTRY_FILE].decode("utf-8"), publisher=publisher,
                                                repository=repository).encode("utf-8")
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise RefusedError(f"{dest} is not a folder", hint="name a new folder")
    earlier = dest.is_dir() and any(dest.iterdir())
    if earlier and registry_name(dest / REGISTRY_FILE) != name.lower():
        raise RefusedError(f"{dest} holds other files and no earlier export of {name}",
                           hint="name a new or empty folder (or a clone of the pack's repository)")
    removed = stale_package_files(dest, meta["package"], files) if earlier else []
    written = write_folder(dest, files, remove=tuple(removed), mode=0o644)
    return {"folder": str(dest), "name": name, "version": meta["version"], "files": sorted(files),
            "removed": removed, "recovered": str(written.staging) if written.recovered else None}


def stale_package_files(dest: Path, package: str, files: dict[str, bytes]) -> list[str]:
    """The package files of an earlier export that the pack no longer has (bytecode and __pycache__ aside), found
    by a walk from dest's held handle (a link in an earlier clone never leads out)."""
    held = hold(dest)
    try:
        return [f"{where}/{entry}"
                for where, entries in held.walk(package, max_depth=MAX_WALK_DEPTH, max_entries=MAX_WALK_ENTRIES)
                if "__pycache__" not in where.split("/") for entry, st in entries
                if stat.S_ISREG(st.st_mode) and not entry.endswith((".pyc", ".pyo"))
                and f"{where}/{entry}" not in files]
    finally:
        held.close()


def registry_name(path: Path, top: Path | None = None) -> str | None:
    """[project] name (lower case: the registry compares ids so) of a pyproject.toml, None when there is none or
    it does not parse. With top, the file is read only where it really lies inside top."""
    try:
        data = read_inside_or_none(top, path) if top is not None else path.read_bytes()
    except (ApplierError, OSError):
        return None
    try:
        name = tomllib.loads(data.decode("utf-8")).get("project", {}).get("name") if data else None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError):
        return None
    return name.lower() if isinstance(name, str) else None


@dataclass(frozen=True)
class PackCopy:
    """A folder under custom_nodes/ that holds the node pack."""
    folder: Path
    source: Installer           # GIT, REGISTRY or COPIED, by what it holds (only the manifest says APPLIER)
    version: str | None         # its pyproject.toml's [project] version
    carries_package: bool       # the kernels package inside it (a standalone folder)
    disabled: bool              # named *.disabled: ComfyUI does not load it
    same_as_this_applier: bool  # its node files (and package, if carried) are this applier's pack byte for byte

    def to_json(self) -> dict:
        return {"folder": str(self.folder), "source": self.source, "version": self.version,
                "carries_package": self.carries_package, "disabled": self.disabled,
                "same_as_this_applier": self.same_as_this_applier}


def find_copies(comfyui_root: Path, pack_dir: Path = OVERLAYS_DIR) -> list[PackCopy]:
    """Every folder under custom_nodes/ holding the node pack: its pyproject.toml names the pack's registry id, or
    it has the node folder's name. Nothing outside the ComfyUI folder is read: a custom_nodes/ entry that is a link
    is not looked into."""
    meta = read_pack(pack_dir)
    wanted = registry_metadata(pack_dir)["project"]["name"].lower()
    custom = Path(comfyui_root) / "custom_nodes"
    try:
        entries = sorted(os.listdir(custom))
    except OSError:
        return []
    ours = standalone_files(pack_dir)
    copies = []
    for entry in entries:
        folder = custom / entry
        try:
            if entry.startswith(".") or entry == "__pycache__" or not stat.S_ISDIR(os.lstat(folder).st_mode):
                continue
        except OSError:
            continue
        pyproject = folder / REGISTRY_FILE
        if registry_name(pyproject, comfyui_root) != wanted and entry.removesuffix(DISABLED_SUFFIX) != meta["node"]:
            continue
        carried = _read(comfyui_root, folder / meta["package"] / "__init__.py") is not None
        copies.append(PackCopy(folder=folder, source=source_of(folder),
                               version=project_version(pyproject, comfyui_root), carries_package=carried,
                               disabled=entry.endswith(DISABLED_SUFFIX),
                               same_as_this_applier=_same_files(comfyui_root, folder, ours, meta["package"], carried)))
    return copies


def source_of(folder: Path) -> Installer:
    for marker, source in SOURCE_MARKERS:
        if os.path.lexists(folder / marker):
            return source
    return Installer.COPIED


def project_version(path: Path, top: Path) -> str | None:
    data = _read(top, path)
    try:
        version = tomllib.loads(data.decode("utf-8")).get("project", {}).get("version") if data else None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError):
        return None
    return version if isinstance(version, str) else None


def _read(top: Path, path: Path) -> bytes | None:
    try:
        return read_inside_or_none(top, path)
    except ApplierError:
        return None


def _same_files(top: Path, folder: Path, ours: dict[str, bytes], package: str, carries: bool) -> bool:
    """The copy's node files, and its package files where it carries the package, equal this applier's (its
    pyproject.toml aside: a publisher fills two fields at export)."""
    for rel, data in ours.items():
        if rel == REGISTRY_FILE or (rel.startswith(package + "/") and not carries):
            continue
        if _read(top, folder / rel) != data:
            return False
    return True
