"""The diff engine: pure functions, bytes in, bytes out, no file system.

CONTRACT (implemented by the diff-engine work; the shell depends on exactly this API):

    parse_patch(data: bytes) -> list[FilePatch]
        Parse a unified diff (git or plain style) with `unidiff`. Read as bytes: the patch itself may carry CRLF.
        Paths: strip a leading "a/" / "b/" (git style); "/dev/null" marks creation/deletion.
        Raises DiffParseError for: empty/garbled text, binary diffs ("Binary files ... differ", "GIT binary patch"),
        renames/copies/mode-only changes we do not support.

    plan_file(fp: FilePatch, original: bytes | None, *, reverse: bool = False, fuzz: int = 0) -> FilePlan
        original is None when the file does not exist. Returns the new bytes (None = delete the file)
        and one HunkReport per hunk. Never raises for "already applied": that is a state, not an error.
        Raises HunkConflict (applier.errors) naming the file, the hunk, the expected lines, the best near-match.

    classify_file(fp: FilePatch, original: bytes | None) -> FileState
        APPLIED when every hunk's post-image is present (and the pre-image is not where it would apply),
        NOT_APPLIED when every hunk's pre-image is present, PARTIAL when some hunks are applied and the others
        apply, CONFLICT otherwise. Used by status and by apply ("already applied" is reported, never re-applied).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class HunkState(str, enum.Enum):
    APPLIED = "applied"          # the post-image is present
    NOT_APPLIED = "not-applied"  # the pre-image is present: the hunk would apply
    CONFLICT = "conflict"        # neither


class FileState(str, enum.Enum):
    APPLIED = "applied"
    NOT_APPLIED = "not-applied"
    PARTIAL = "partial"
    CONFLICT = "conflict"


@dataclass(frozen=True)
class Hunk:
    index: int                     # 1-based within its file
    source_start: int              # 1-based line in the pre-image (as written in the @@ header)
    source_length: int
    target_start: int
    target_length: int
    header: str                    # "@@ -a,b +c,d @@ section"
    # Each line as (kind, text) with kind in " ", "-", "+"; text WITHOUT its line ending.
    lines: tuple[tuple[str, str], ...]
    # "\ No newline at end of file" after the last pre-image / post-image line.
    source_no_newline: bool = False
    target_no_newline: bool = False

    @property
    def before(self) -> list[str]:
        return [text for kind, text in self.lines if kind in (" ", "-")]

    @property
    def after(self) -> list[str]:
        return [text for kind, text in self.lines if kind in (" ", "+")]


@dataclass(frozen=True)
class FilePatch:
    path: str                      # relative path inside the component root, "/" separators, no a/ b/ prefix
    is_new: bool                   # created by the patch (source /dev/null)
    is_deleted: bool               # deleted by the patch (target /dev/null)
    hunks: tuple[Hunk, ...]


@dataclass(frozen=True)
class HunkReport:
    path: str
    index: int
    state: HunkState               # the state found BEFORE the plan (for apply: NOT_APPLIED means "will apply")
    line: int | None               # 1-based line where the hunk was found (in the file as given)
    offset: int = 0                # found line minus the header's line
    fuzz: int = 0                  # context lines ignored to place it (only when fuzz > 0 was allowed)
    note: str = ""


@dataclass(frozen=True)
class FilePlan:
    path: str
    old: bytes | None
    new: bytes | None              # None: the file is to be deleted
    hunks: tuple[HunkReport, ...] = field(default_factory=tuple)

    @property
    def changed(self) -> bool:
        return self.old != self.new
