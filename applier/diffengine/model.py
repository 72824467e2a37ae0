"""The data model of the diff engine: hunk and file states, parsed patches, per-hunk reports, file plans."""
from __future__ import annotations

from dataclasses import dataclass, field

from applier.strenum import StrEnum

class HunkState(StrEnum):
    APPLIED = "applied"          # the post-image is present
    NOT_APPLIED = "not-applied"  # the pre-image is present: the hunk would apply
    CONFLICT = "conflict"        # neither


class FileState(StrEnum):
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
    # The ending each line carried in the patch, parallel to `lines`: "\n", "\r\n", "" (no newline), or None when
    # the patch carries no ending information (a CRLF-transported patch). Empty: unknown for every line.
    endings: tuple[str | None, ...] = ()
    # Line 1 of the pre-image / post-image started with a UTF-8 BOM (removed from the text in `lines`).
    source_bom: bool = False
    target_bom: bool = False

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
