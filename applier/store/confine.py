"""Confinement: the only way a path read back from `.applier/` becomes a path on disk; pure, given its allow-list.

State, journal and overlay manifest are data an attacker may have written (anyone who can write the tree can write
them, and a later `sudo applier revert` must not overwrite a file of their choosing). So they never hold absolute
paths: every file is named by a root of the target and a path relative to it, and every read resolves it here:

    root "comfyui"        the ComfyUI folder (the `comfyui` component's diffs are relative to it)
    root "site-packages"  the target's site-packages (the `torch` component's diffs are relative to it): where
                          torch is, which may be a parent environment's
    root "purelib"        the environment's own site-packages, the overlay package's home (an older applier
                          recorded the package under "site-packages": read as "purelib" where both are one folder)

A name resolves only when its path is relative, has no `..`, stays inside the root after every symlink, does not
lead into `.applier/`, and is one the catalog's patches could touch (or, for overlay files, lies under the overlay
pack's package or node folder). Anything else is a StateCorruptError (exit 7), raised before any write. Because
the names are relative, a copied or moved install works on itself.

This module is given what it validates against (the roots, the catalog's paths, the pack's folders): it knows
neither the catalog nor the overlay pack. `allowlist.py`, above it, computes them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from applier.errors import IOFailure, StateCorruptError
from applier.store.fsutil import MAX_READ_BYTES, hold, io_failure, sha256_bytes
from applier.store.heldroot import HeldRoot
from applier.store.paths import STATE_DIR_NAME, real_inside

ROOTS = ("comfyui", "purelib", "site-packages")      # relative() tries them in this order: roots may be one folder
LEGACY_ROOTS = ("comfyui", "site-packages")          # format 1's absolute paths map onto these
COMPONENT_ROOT = {"comfyui": "comfyui", "torch": "site-packages"}
PACKAGE_ROOT = "purelib"


@dataclass
class Sweep:
    """Where a killed write can have left a temp file: folders listed (their own entries) and trees walked, each a
    (handle, relative path) pair, within the walk's limits."""
    listed: list
    walked: list
    max_depth: int
    max_entries: int


@dataclass(frozen=True)
class OverlayPrefixes:
    """Where the overlay pack installs: <purelib>/<package>/ and <ComfyUI>/custom_nodes/<node>/ (an older applier's
    <site-packages>/<package>/ is read, and removed by uninstall, where its manifest names it)."""
    package: str | None = None
    node: str | None = None

    def allows(self, root: str, relpath: str) -> bool:
        if root in (PACKAGE_ROOT, "site-packages") and self.package:
            return relpath.startswith(self.package + "/")
        if root == "comfyui" and self.node:
            return relpath.startswith(f"custom_nodes/{self.node}/")
        return False


@dataclass(frozen=True)
class Place:
    """A file of the target, checked once where it entered (Confinement.resolve / relative) and carried from there:
    its root, its path relative to that root, and the root's held handle that every read and write of it goes
    through. Never turned back into a path string for the kernel to resolve: `path` is for messages."""
    root: str
    relpath: str
    held: HeldRoot = field(compare=False, hash=False, repr=False)

    @property
    def path(self) -> Path:
        return self.held.display(self.relpath)

    def __str__(self) -> str:
        return str(self.path)

    def read(self, *, limit: int) -> bytes | None:
        """Its bytes, None when it does not exist; IOFailure (exit 8) when it cannot be read, is special, too large
        or a link leading out of its root."""
        try:
            return self.held.read(self.relpath, limit=limit)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except IOFailure:
            raise
        except OSError as exc:
            raise io_failure(exc, self.path, "read") from exc

    def sha256(self) -> str | None:
        """The sha256 of its bytes, None when it does not exist (read's rules)."""
        data = self.read(limit=MAX_READ_BYTES)
        return None if data is None else sha256_bytes(data)


@dataclass
class Confinement:
    """The roots of one target and the relative paths each may hold; each root the target has is held as a
    directory handle from the moment the confinement is made (once per command), so the root a command checks is
    the one it writes."""
    roots: dict[str, Path | None]
    state_dir: Path
    catalog_paths: dict[str, set[str]] = field(default_factory=dict)
    overlay: OverlayPrefixes = OverlayPrefixes()
    handles: dict[str, HeldRoot] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for root, base in self.roots.items():
            if base is not None and root not in self.handles:
                try:
                    self.handles[root] = hold(base)
                except OSError as exc:
                    raise io_failure(exc, base, "open") from exc

    def handle(self, root: str) -> HeldRoot:
        """The held handle of a root (StateCorruptError for a root the target does not have)."""
        self.root_path(root)
        return self.handles[root]

    def place(self, root: str, relpath: str) -> Place:
        return Place(root, relpath, self.handle(root))

    def root_path(self, root: str) -> Path:
        if root not in ROOTS:
            raise StateCorruptError(f"unknown root {root!r} in the state (known: {', '.join(ROOTS)})",
                                    hint=REPAIR_HINT)
        base = self.roots.get(root)
        if base is None:
            raise StateCorruptError(f"the state names a file in {root}, which this target does not have",
                                    hint="`applier detect` says why (no Python environment found, or one whose "
                                         "site-packages a link leads outside the install); give --python PATH, "
                                         "or inspect .applier/ by hand (plain JSON); nothing was changed")
        return base

    def allows(self, root: str, relpath: str) -> bool:
        return relpath in self.catalog_paths.get(root, ()) or self.overlay.allows(root, relpath)

    def resolve(self, root: str, relpath, *, what: str = "the state") -> Place:
        """(root, relpath) as a Place of this target, checked; StateCorruptError when any check fails."""
        rel = check_relpath(relpath, what)
        root = self.canonical_root(root, rel)
        base = self.root_path(root)
        if not self.allows(root, rel):
            raise StateCorruptError(f"{what} names {root}:{rel}, which no catalog patch or overlay can touch",
                                    hint=REPAIR_HINT)
        path = base.joinpath(*PurePosixPath(rel).parts)
        real = Path(os.path.realpath(path))
        base_real = Path(os.path.realpath(base))
        if base_real not in real.parents:
            raise StateCorruptError(f"{what} names {root}:{rel}, which resolves to {real}, outside {base_real}",
                                    hint=LINK_HINT if what == "this run" else REPAIR_HINT)
        state_real = Path(os.path.realpath(self.state_dir))
        if real == state_real or state_real in real.parents:
            raise StateCorruptError(f"{what} names {root}:{rel}, which lies inside {self.state_dir}",
                                    hint=REPAIR_HINT)
        if real.is_dir():
            raise StateCorruptError(f"{what} names {root}:{rel}, which is a folder", hint=REPAIR_HINT)
        return self.place(root, rel)

    def canonical_root(self, root: str, rel: str) -> str:
        """"purelib" for an overlay package path an older applier recorded under "site-packages", where the two
        roots are one folder (so a Place is one key whichever applier wrote it); else root as given."""
        if root != "site-packages" or not self.overlay.allows(PACKAGE_ROOT, rel):
            return root
        if rel in self.catalog_paths.get(root, ()):
            return root
        here, there = self.roots.get(root), self.roots.get(PACKAGE_ROOT)
        if here is not None and there is not None and os.path.realpath(here) == os.path.realpath(there):
            return PACKAGE_ROOT
        return root

    def resolve_dir(self, root: str, relpath, *, what: str = "the state") -> Place:
        """A folder the overlay pack installs into (a run removes it when it leaves it empty), checked."""
        rel = check_relpath(relpath, what)
        root = self.canonical_root(root, rel + "/")
        base = self.root_path(root)
        if not self.overlay.allows(root, rel + "/"):
            raise StateCorruptError(f"{what} names the folder {root}:{rel}, which the overlay pack does not own",
                                    hint=REPAIR_HINT)
        path = base.joinpath(*PurePosixPath(rel).parts)
        if Path(os.path.realpath(base)) not in Path(os.path.realpath(path)).parents:
            raise StateCorruptError(f"{what} names the folder {root}:{rel}, outside {base}", hint=REPAIR_HINT)
        return self.place(root, rel)

    def relative_dir(self, folder) -> Place:
        if isinstance(folder, Place):
            return folder
        for root in ROOTS:
            base = self.roots.get(root)
            if base is None:
                continue
            try:
                rel = Path(folder).relative_to(base).as_posix()
            except ValueError:
                continue
            if self.overlay.allows(root, rel + "/"):   # roots nest (a venv inside the ComfyUI folder)
                return self.resolve_dir(root, rel, what="this run")
        raise StateCorruptError(f"refusing to prune {folder}: not a folder of the overlay pack in this target",
                                hint="a bug: please report it")

    def catalog_folders(self) -> list[Path]:
        return [place.path for place in self.catalog_folder_places()]

    def overlay_tops(self) -> list[Path]:
        return [place.path for place in self.overlay_top_places()]

    def catalog_folder_places(self) -> list[Place]:
        """Every folder a catalog patch writes into: where a killed atomic write can have left its temp file. A
        folder that a link leads outside its root (or into the state folder) is none of this target's: left out,
        so that nothing is listed or removed there (and the handle refuses it again when it is walked)."""
        folders = set()
        for root, relpaths in self.catalog_paths.items():
            base = self.roots.get(root)
            if base is None:
                continue
            for rel in relpaths:
                folder_rel = PurePosixPath(rel).parent.as_posix()
                folder_rel = "" if folder_rel == "." else folder_rel
                if self.own_folder(base, base.joinpath(*PurePosixPath(folder_rel).parts)):
                    folders.add(self.place(root, folder_rel))
        return sorted(folders, key=lambda p: (p.root, p.relpath))

    def overlay_top_places(self) -> list[Place]:
        """The overlay pack's install folders in this target (the pack writes anywhere below them); one that a link
        leads outside its root is left out, as in catalog_folders."""
        tops = []
        for root, prefix in ((PACKAGE_ROOT, self.overlay.package),
                             ("comfyui", f"custom_nodes/{self.overlay.node}" if self.overlay.node else None)):
            base = self.roots.get(root)
            if base is not None and prefix is not None:
                if self.own_folder(base, base.joinpath(*PurePosixPath(prefix).parts)):
                    tops.append(self.place(root, prefix))
        return tops

    def sweep(self, state: HeldRoot | None, *, max_depth: int, max_entries: int) -> Sweep:
        """Where a killed write can have left a temp file: every folder a catalog patch writes to (listed), the
        overlay pack's install folders and the state folder (walked)."""
        walked = [(p.held, p.relpath) for p in self.overlay_top_places()]
        return Sweep(listed=[(p.held, p.relpath) for p in self.catalog_folder_places()],
                     walked=walked + ([(state, "")] if state is not None else []), max_depth=max_depth,
                     max_entries=max_entries)

    def own_folder(self, base: Path, folder: Path) -> bool:
        """folder, every link on its way followed, lies inside base and outside the state folder."""
        return real_inside(base, folder) and not real_inside(self.state_dir, folder)

    def relative(self, path) -> Place:
        """The Place of a path the core is about to write: the inverse of resolve, with the same checks."""
        if isinstance(path, Place):
            return path
        path = Path(path)
        for root in ROOTS:
            base = self.roots.get(root)
            if base is None:
                continue
            try:
                rel = path.relative_to(base).as_posix()
            except ValueError:
                continue
            if self.allows(root, rel):
                return self.resolve(root, rel, what="this run")
        raise StateCorruptError(f"refusing to write {path}: it is not a file any catalog patch or overlay touches "
                                "inside this target", hint="a bug or a crafted catalog: please report it")


LINK_HINT = ("a link in the target leads there, out of the install: applier never writes through one; nothing was "
             "changed. Put the folder or file itself in place of the link (or move the link aside) and run again")
REPAIR_HINT = ("the state was edited or crafted; nothing was changed. Inspect .applier/ by hand (plain JSON), "
               "or move it aside and reinstall the files it names")


def missing_folders(places: list[Place]) -> list[Place]:
    """The folders the run's writes will create (they do not exist yet), deepest first: a rolled-back run removes
    them again when it leaves them empty."""
    out = {}
    for place in places:
        parts = place.relpath.split("/")[:-1]
        while parts:
            rel = "/".join(parts)
            try:
                there = place.held.lstat(rel) is not None
            except (OSError, IOFailure):
                there = True
            if there:
                break
            out[(place.root, rel)] = Place(place.root, rel, place.held)
            parts.pop()
    return sorted(out.values(), key=lambda p: p.relpath.count("/"), reverse=True)


def check_relpath(relpath, what: str) -> str:
    if not isinstance(relpath, str) or not relpath or "\x00" in relpath or "\\" in relpath:
        raise StateCorruptError(f"{what} holds an invalid relative path: {relpath!r}", hint=REPAIR_HINT)
    try:
        os.fsencode(relpath)     # a lone surrogate (JSON can hold one) is no name a file system can have
    except UnicodeEncodeError:
        raise StateCorruptError(f"{what} holds a path no file name can have: {relpath!r}", hint=REPAIR_HINT) from None
    parts = PurePosixPath(relpath).parts
    if relpath.startswith("/") or (len(relpath) > 1 and relpath[1] == ":") or ".." in parts or "." in parts \
            or PurePosixPath(relpath).as_posix() != relpath:
        raise StateCorruptError(f"{what} holds a path that is not a plain relative path: {relpath!r}",
                                hint=REPAIR_HINT)
    if STATE_DIR_NAME in parts:
        raise StateCorruptError(f"{what} names a file inside {STATE_DIR_NAME}/: {relpath!r}", hint=REPAIR_HINT)
    return relpath


def legacy_relative(path, confinement: Confinement) -> tuple[str, str]:
    """(root, relpath) of an absolute path written by format 1 (applier 0.x kept absolute paths). Only a path
    inside one of this target's roots maps; a path of another folder (the install was copied) cannot be trusted."""
    if not isinstance(path, str):
        raise StateCorruptError(f"the state holds an invalid path: {path!r}", hint=REPAIR_HINT)
    for root in LEGACY_ROOTS:
        base = confinement.roots.get(root)
        if base is None:
            continue
        try:
            return root, Path(path).relative_to(base).as_posix()
        except ValueError:
            continue
    raise StateCorruptError(f"the state names {path}, outside this target (was the install copied or moved "
                            "while an older applier's run was in flight?)", hint=REPAIR_HINT)
