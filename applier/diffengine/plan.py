"""Scanning, classifying and planning a file patch, and applying a hunk's lines (the engine's entry points)."""
from __future__ import annotations

from applier.diffengine.conflict import _conflict, _display_lines, _near_match
from applier.diffengine.lines import _FileLines, _encode, _split_file
from applier.diffengine.locate import _Finding, _report, _scan
from applier.diffengine.model import FilePatch, FilePlan, FileState, Hunk, HunkReport, HunkState
from applier.diffengine.wholefile import _new_file_bytes, _scan_whole
from applier.errors import HunkConflict

def scan_file(fp: FilePatch, original: bytes | None, *, fuzz: int = 0) -> tuple[HunkReport, ...]:
    """One HunkReport per hunk (APPLIED / NOT_APPLIED / CONFLICT), never raising for a conflict."""
    _check_fuzz(fuzz)
    if fp.is_new or fp.is_deleted:
        state, reason = _scan_whole(fp, original)
        line = None if original is None else 1
        return tuple(HunkReport(fp.path, hunk.index, state, line, note=reason) for hunk in fp.hunks)
    if original is None:
        return tuple(HunkReport(fp.path, hunk.index, HunkState.CONFLICT, None, note="the file does not exist")
                     for hunk in fp.hunks)
    file = _split_file(original)
    return tuple(_report(fp, hunk, finding) for hunk, finding in zip(fp.hunks, _scan(fp, file, fuzz)))


def classify_file(fp: FilePatch, original: bytes | None, *, fuzz: int = 0) -> FileState:
    """APPLIED, NOT_APPLIED, PARTIAL (some applied, the rest applicable) or CONFLICT."""
    if not fp.hunks:
        states = {_empty_creation_state(original) if fp.is_new else _empty_deletion_state(original)}
    else:
        states = {report.state for report in scan_file(fp, original, fuzz=fuzz)}
    if HunkState.CONFLICT in states:
        return FileState.CONFLICT
    if states == {HunkState.APPLIED}:
        return FileState.APPLIED
    if states == {HunkState.NOT_APPLIED}:
        return FileState.NOT_APPLIED
    return FileState.PARTIAL


def _empty_creation_state(original: bytes | None) -> HunkState:
    if original is None:
        return HunkState.NOT_APPLIED
    return HunkState.APPLIED if original == b"" else HunkState.CONFLICT


def _empty_deletion_state(original: bytes | None) -> HunkState:
    if original is None:
        return HunkState.APPLIED
    return HunkState.NOT_APPLIED if original == b"" else HunkState.CONFLICT


def plan_file(fp: FilePatch, original: bytes | None, *, fuzz: int = 0) -> FilePlan:
    """The new bytes of one file (None: delete it) and a report per hunk. Raises HunkConflict."""
    _check_fuzz(fuzz)
    if not fp.hunks:
        return _plan_empty(fp, original)
    if fp.is_new or fp.is_deleted:
        return _plan_whole(fp, original)
    if original is None:
        hunk = fp.hunks[0]
        raise HunkConflict(fp.path, hunk.index, hunk.header, _display_lines(hunk.before), None, [],
                           "the file does not exist")
    file = _split_file(original)
    findings = _scan(fp, file, fuzz)
    for index, finding in enumerate(findings):
        if finding.state is HunkState.CONFLICT:
            raise _conflict(fp, index, file, findings, fuzz)
    reports = tuple(_report(fp, hunk, finding) for hunk, finding in zip(fp.hunks, findings))
    if all(finding.state is HunkState.APPLIED for finding in findings):
        return FilePlan(fp.path, original, original, reports)
    out: list[tuple[bytes, bytes]] = []
    cursor = 0
    for hunk, finding in zip(fp.hunks, findings):
        if finding.state is not HunkState.NOT_APPLIED:
            continue
        out += zip(file.contents[cursor:finding.pos], file.endings[cursor:finding.pos])
        out += _apply_hunk(hunk, finding, file, out)
        cursor = finding.pos + finding.size
    out += zip(file.contents[cursor:], file.endings[cursor:])
    return FilePlan(fp.path, original, file.render(out), reports)


def apply_patch_to_files(patches: list[FilePatch], files: dict[str, bytes | None], *,
                         fuzz: int = 0) -> list[FilePlan]:
    """Plan every file patch, in order, against `files` (path -> bytes, None or missing: absent); one plan per
    patch, in the patches' order. A path patched twice sees the result of the first patch (to undo a list of
    patches, apply reverse_patches(patches): the last one is undone first). Raises HunkConflict."""
    current = dict(files)
    plans: list[FilePlan] = []
    for fp in patches:
        plan = plan_file(fp, current.get(fp.path), fuzz=fuzz)
        current[fp.path] = plan.new
        plans.append(plan)
    return plans


def _check_fuzz(fuzz: int) -> None:
    if fuzz < 0:
        raise ValueError(f"fuzz must be >= 0, not {fuzz}")


def _plan_empty(fp: FilePatch, original: bytes | None) -> FilePlan:
    """A git diff creating or deleting an empty file carries no hunk."""
    if fp.is_new:
        state = _empty_creation_state(original)
        if state is HunkState.CONFLICT:
            raise HunkConflict(fp.path, 0, "(new empty file)", [], None, [],
                               "the patch creates this empty file, but it already exists with content")
        return FilePlan(fp.path, original, b"" if original is None else original)
    state = _empty_deletion_state(original)
    if state is HunkState.CONFLICT:
        raise HunkConflict(fp.path, 0, "(deleted empty file)", [], None, [],
                           "the patch deletes this empty file, but it has content")
    return FilePlan(fp.path, original, None)


def _plan_whole(fp: FilePatch, original: bytes | None) -> FilePlan:
    state, reason = _scan_whole(fp, original)
    line = None if original is None else 1
    reports = tuple(HunkReport(fp.path, hunk.index, state, line,
                               note="already applied" if state is HunkState.APPLIED else "")
                    for hunk in fp.hunks)
    if state is HunkState.CONFLICT:
        hunk = fp.hunks[0]
        expected = _display_lines(hunk.after if fp.is_new else hunk.before)
        near_line, near_text = _near_match(_split_file(original), expected)
        raise HunkConflict(fp.path, hunk.index, hunk.header, expected, near_line, near_text, reason)
    if state is HunkState.APPLIED:
        return FilePlan(fp.path, original, original, reports)
    return FilePlan(fp.path, original, _new_file_bytes(fp) if fp.is_new else None, reports)


def _apply_hunk(hunk: Hunk, finding: _Finding, file: _FileLines,
                before: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The post-image lines that replace the matched pre-image, with their endings."""
    shape = finding.shape
    endings = hunk.endings or (None,) * len(hunk.lines)
    stop = len(hunk.lines) - shape.drop_end
    last_post = max((i for i, (kind, _) in enumerate(hunk.lines) if kind in " +"), default=-1)
    out: list[tuple[bytes, bytes]] = []
    cursor = finding.pos
    removed_endings: list[bytes] = []  # endings of the removed lines of the current block of changes
    added_in_block = 0
    for i in range(shape.drop_start, stop):
        kind, text = hunk.lines[i]
        if kind == " ":
            out.append((file.contents[cursor], file.endings[cursor]))
            cursor += 1
            removed_endings, added_in_block = [], 0
        elif kind == "-":
            if added_in_block:
                removed_endings, added_in_block = [], 0
            removed_endings.append(file.endings[cursor])
            cursor += 1
        else:
            if i == last_post and hunk.target_no_newline:
                ending = b""
            elif finding.exact and endings[i]:
                ending = endings[i].encode()
            else:
                previous = out[-1][1] if out else (before[-1][1] if before else None)
                ending = _neighbour_ending(file, removed_endings, added_in_block, previous, cursor)
            out.append((_encode(text), ending))
            added_in_block += 1
    return out


def _neighbour_ending(file: _FileLines, removed_endings: list[bytes], added_in_block: int,
                      previous: bytes | None, cursor: int) -> bytes:
    """An inserted line takes the file's ending: the replaced line's, else the previous, else the next line's."""
    if removed_endings:
        ending = removed_endings[min(added_in_block, len(removed_endings) - 1)]
    elif previous is not None:
        ending = previous
    elif cursor < file.count:
        ending = file.endings[cursor]
    else:
        ending = b""
    return ending or file.dominant_ending()
