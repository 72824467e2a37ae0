"""The state folder `<target>/.applier/`: plain JSON and plain files a person can read and repair.

    .applier/state.json          what is applied: patch, variant, files with sha256 before/after, versions
    .applier/backups/<patch id>/<component>/<relative path>    original bytes of every file a patch changed
    .applier/journal.json        only while an apply/revert is in flight: what is being done, in words and data
    .applier/displaced/<time>/...  bytes a forced revert moved aside (nothing the user wrote is lost)
    .applier/overlays.json       files installed by `applier overlay install` (the manifest)
    .applier/lock                the lock file of the target
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from applier.errors import StateCorruptError
from applier.fsutil import atomic_write

STATE_FORMAT = 1


@dataclass
class AppliedFile:
    path: str                       # absolute path of the file in the target
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

    @classmethod
    def from_json(cls, data: dict) -> "AppliedPatch":
        files = [AppliedFile(**f) for f in data["files"]]
        return cls(**{**data, "files": files})


@dataclass
class State:
    applied: dict[str, AppliedPatch] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"format": STATE_FORMAT, "applied": {k: asdict(v) for k, v in self.in_order()}}

    def in_order(self) -> list[tuple[str, "AppliedPatch"]]:
        return sorted(self.applied.items(), key=lambda item: (item[1].seq, item[0]))

    def next_seq(self) -> int:
        return max((p.seq for p in self.applied.values()), default=0) + 1

    def last_writer(self, path: str) -> "AppliedPatch | None":
        """The applied patch that wrote `path` last (its sha256_after is what the file should hold)."""
        writers = [p for _, p in self.in_order() if any(f.path == path for f in p.files)]
        return writers[-1] if writers else None


class StateStore:
    def __init__(self, state_dir: Path):
        self.dir = Path(state_dir)

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

    def load(self) -> State:
        data = read_json(self.state_file)
        if data is None:
            return State()
        try:
            if data.get("format") != STATE_FORMAT:
                raise ValueError(f"unknown format {data.get('format')!r}")
            return State({k: AppliedPatch.from_json(v) for k, v in data["applied"].items()})
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateCorruptError(
                f"state file {self.state_file} is corrupt ({exc})",
                hint="inspect it by hand (plain JSON); backups of original bytes are in "
                     f"{self.backups}; move the folder aside to start over") from exc

    def save(self, state: State) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.state_file, dump_json(state.to_json()))

    def backup_path(self, patch_id: str, component: str, relpath: str) -> Path:
        # Keyed by patch id + component + relative path: torch alone has hundreds of __init__.py.
        return self.backups / patch_id / component / relpath


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


def ensure_dir(path: Path) -> None:
    os.makedirs(path, exist_ok=True)
