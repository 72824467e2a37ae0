"""The state folder `<target>/.applier/`: plain JSON and plain files a person can read and repair.

    .applier/state.json          what is applied: patch, variant, files (relative to their component root) with
                                 sha256 before/after, versions; format 2, validated on every read (confine.py)
    .applier/backups/<patch id>/<component>/<relative path>    original bytes of every file a patch changed
    .applier/journal.json        only while an apply/revert is in flight: what is being done, in words and data
    .applier/displaced/<time>/...  bytes a forced revert moved aside (nothing the user wrote is lost)
    .applier/overlays.json       files installed by `applier overlay install` (the manifest)
    .applier/lock                the lock file of the target
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from applier.confine import COMPONENT_ROOT, Confinement, check_relpath
from applier.errors import StateCorruptError
from applier.fsutil import atomic_write

STATE_FORMAT = 2
READABLE_FORMATS = (1, 2)      # format 1 (applier 0.1) also kept an absolute "path" per file: it is ignored
PATCH_ID = re.compile(r"(comfyui|torch)/[A-Za-z0-9][A-Za-z0-9._-]*")
SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass
class AppliedFile:
    relpath: str                    # relative to its component root, "/" separators
    sha256_before: str | None       # None: the patch created the file
    sha256_after: str | None        # None: the patch deleted the file
    backup: str | None = None       # relative to the state folder; None for created files
    mode: int | None = None


@dataclass
class AppliedPatch:
    id: str
    variant: str
    component: str
    files: list[AppliedFile]
    component_version: str | None
    applied_at: str
    applier_version: str = ""
    seq: int = 0                    # application order: a later patch on the same file sits on top
    fuzz: int = 0                   # the fuzz it was applied with: status and revert must look with the same

    @property
    def root(self) -> str:
        return COMPONENT_ROOT[self.component]

    @classmethod
    def from_json(cls, patch_id, data) -> "AppliedPatch":
        """Strictly typed: a field of the wrong type is a StateCorruptError, never a crash later."""
        where = f"state entry {patch_id!r}"
        need(isinstance(data, dict), f"{where} is not an object")
        need(isinstance(patch_id, str) and PATCH_ID.fullmatch(patch_id), f"{where}: not a patch id")
        rec_id = field_of(data, "id", str, where)
        component = field_of(data, "component", str, where)
        need(rec_id == patch_id, f"{where}: its id says {rec_id!r}")
        need(component == patch_id.split("/")[0], f"{where}: component {component!r} does not match its id")
        files = field_of(data, "files", list, where)
        return cls(
            id=rec_id, variant=field_of(data, "variant", str, where), component=component,
            files=[applied_file(f, patch_id, component, where) for f in files],
            component_version=field_of(data, "component_version", (str, type(None)), where),
            applied_at=field_of(data, "applied_at", str, where),
            applier_version=field_of(data, "applier_version", str, where, default=""),
            seq=field_of(data, "seq", int, where, default=0),
            fuzz=field_of(data, "fuzz", int, where, default=0))


def applied_file(data, patch_id: str, component: str, where: str) -> AppliedFile:
    need(isinstance(data, dict), f"{where}: a file entry is not an object")
    relpath = check_relpath(field_of(data, "relpath", str, where), where)
    before = field_of(data, "sha256_before", (str, type(None)), where)
    after = field_of(data, "sha256_after", (str, type(None)), where)
    for digest in (before, after):
        need(digest is None or SHA256.fullmatch(digest), f"{where}: {relpath}: a sha256 is not 64 hex digits")
    backup = field_of(data, "backup", (str, type(None)), where, default=None)
    if backup is not None:
        # Never trusted as a path: it must be the one name this patch's backup of this file can have.
        need(backup == backup_name(patch_id, component, relpath), f"{where}: {relpath}: unexpected backup {backup!r}")
    mode = field_of(data, "mode", (int, type(None)), where, default=None)
    need(mode is None or 0 <= mode <= 0o7777, f"{where}: {relpath}: bad mode")
    return AppliedFile(relpath, before, after, backup, mode)


def backup_name(patch_id: str, component: str, relpath: str) -> str:
    # Keyed by patch id + component + relative path: torch alone has hundreds of __init__.py.
    return f"backups/{patch_id}/{component}/{relpath}"


def need(condition, message: str) -> None:
    if not condition:
        raise StateCorruptError(message, hint="inspect .applier/ by hand (plain JSON); nothing was changed")


MISSING = object()


def field_of(data: dict, key: str, types, where: str, default=MISSING):
    if key not in data:
        need(default is not MISSING, f"{where} lacks {key!r}")
        return default
    value = data[key]
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in _as_tuple(types))
    need(ok, f"{where}: {key!r} has the wrong type ({type(value).__name__})")
    return value


def _as_tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)


@dataclass
class State:
    applied: dict[str, AppliedPatch] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"format": STATE_FORMAT, "applied": {k: asdict(v) for k, v in self.in_order()}}

    @classmethod
    def from_json(cls, data, confinement: Confinement, *, what: str = "state") -> "State":
        """A State from JSON, every field typed and every file resolvable inside the target (else exit 7)."""
        need(isinstance(data, dict), f"{what} is not a JSON object")
        need(data.get("format") in READABLE_FORMATS, f"{what} has an unknown format {data.get('format')!r}")
        applied = field_of(data, "applied", dict, what)
        state = cls({k: AppliedPatch.from_json(k, v) for k, v in applied.items()})
        for record in state.applied.values():
            for f in record.files:
                confinement.resolve(record.root, f.relpath, what=f"{what} ({record.id})")
        return state

    def in_order(self) -> list[tuple[str, "AppliedPatch"]]:
        return sorted(self.applied.items(), key=lambda item: (item[1].seq, item[0]))

    def next_seq(self) -> int:
        return max((p.seq for p in self.applied.values()), default=0) + 1

    def last_writer(self, component: str, relpath: str) -> "AppliedPatch | None":
        """The applied patch that wrote the file last (its sha256_after is what the file should hold)."""
        writers = [p for _, p in self.in_order()
                   if p.component == component and any(f.relpath == relpath for f in p.files)]
        return writers[-1] if writers else None


class StateStore:
    """`.applier/` of one target. Every read is validated against the target's Confinement."""

    def __init__(self, state_dir: Path, confinement: Confinement):
        self.dir = Path(state_dir)
        self.confinement = confinement

    @classmethod
    def for_target(cls, target, catalog) -> "StateStore":
        return cls(target.state_dir, Confinement.for_target(target, catalog))

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    @property
    def journal_file(self) -> Path:
        return self.dir / "journal.json"

    @property
    def backups(self) -> Path:
        return self.dir / "backups"

    @property
    def displaced(self) -> Path:
        return self.dir / "displaced"

    @property
    def overlay_manifest(self) -> Path:
        return self.dir / "overlays.json"

    @property
    def lock_file(self) -> Path:
        return self.dir / "lock"

    def check_folder(self) -> None:
        if self.dir.exists() and not self.dir.is_dir():
            raise StateCorruptError(f"{self.dir} is not a folder",
                                    hint="applier keeps its state in that folder: move the file aside")

    def fingerprint(self) -> tuple:
        """What changes when a run records anything: the state file's identity and whether a journal is pending."""
        try:
            st = self.state_file.stat()
            state = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            state = None
        return state, self.journal_file.exists()

    def load(self) -> State:
        self.check_folder()
        data = read_json(self.state_file)
        if data is None:
            return State()
        return State.from_json(data, self.confinement, what=f"state file {self.state_file}")

    def save(self, state: State) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.state_file, dump_json(state.to_json()))

    def path_of(self, record: AppliedPatch, f: AppliedFile) -> Path:
        """The file's place in this target (validated: the state may have been crafted)."""
        return self.confinement.resolve(record.root, f.relpath)

    def backup_path(self, patch_id: str, component: str, relpath: str) -> Path:
        return self.dir / backup_name(patch_id, component, relpath)

    def read_backup(self, record: AppliedPatch, f: AppliedFile) -> bytes | None:
        """The backup's bytes; None when missing or when it is not a plain file inside .applier/backups/."""
        if f.backup is None:
            return None
        path = self.backup_path(record.id, record.component, f.relpath)
        real = Path(os.path.realpath(path))
        if Path(os.path.realpath(self.backups)) not in real.parents or not real.is_file():
            return None
        try:
            return real.read_bytes()
        except OSError:
            return None


def dump_json(data) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=False) + "\n").encode("utf-8")


def read_json(path: Path):
    """The parsed JSON of path, None when it does not exist; StateCorruptError when unreadable or not JSON."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateCorruptError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateCorruptError(
            f"{path} is not valid JSON ({exc})",
            hint=f"inspect or move it aside by hand; original bytes stay in {path.parent / 'backups'}") from exc


def exclude_from_git(target_root: Path) -> None:
    """Keep .applier/ out of `git status` of a git checkout (never touches .gitignore, which is tracked)."""
    exclude = git_exclude_file(target_root)
    if exclude is None:
        return
    line = "/.applier/"
    try:
        existing = exclude.read_text(encoding="utf-8") if exclude.exists() else ""
    except OSError:
        return
    if line in existing.splitlines():
        return
    exclude.parent.mkdir(parents=True, exist_ok=True)
    sep = "" if not existing or existing.endswith("\n") else "\n"
    atomic_write(exclude, (existing + sep + line + "\n").encode("utf-8"))


def git_exclude_file(target_root: Path) -> Path | None:
    """info/exclude of the checkout at target_root. `.git` is a folder in a plain clone and a file ("gitdir: ...")
    in a worktree or a submodule: git itself says where the file is then."""
    dot_git = target_root / ".git"
    if dot_git.is_dir():
        return dot_git / "info" / "exclude"
    if not dot_git.is_file() or shutil.which("git") is None:
        return None
    try:
        proc = subprocess.run(["git", "-C", str(target_root), "rev-parse", "--git-path", "info/exclude"],
                              capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    path = Path(proc.stdout.strip())
    return path if path.is_absolute() else target_root / path

