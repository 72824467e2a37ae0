"""Whole-file patches: the state of a creation or a deletion, and the bytes of a created file."""
from __future__ import annotations

from applier.diffengine.lines import _LF, BOM, _FileLines, _encode, _key, _split_file
from applier.diffengine.locate import _Image, _matches_at
from applier.diffengine.model import FilePatch, Hunk, HunkState

def _whole_image(hunks: tuple[Hunk, ...], kinds: str) -> _Image:
    keys: list[bytes] = []
    endings: list[bytes | None] = []
    no_newline = False
    for hunk in hunks:
        hunk_endings = hunk.endings or (None,) * len(hunk.lines)
        for (kind, text), ending in zip(hunk.lines, hunk_endings):
            if kind in kinds:
                keys.append(_key(_encode(text)))
                endings.append(None if ending is None else ending.encode())
        no_newline = hunk.source_no_newline if kinds == " -" else hunk.target_no_newline
    return _Image(tuple(keys), tuple(endings), no_newline, 0)


def _whole_file_matches(file: _FileLines, image: _Image) -> bool:
    if file.count != len(image):
        return False
    return _matches_at(file, image, 0, len(image), 0)


def _new_file_bytes(fp: FilePatch) -> bytes:
    added = [(_encode(text), ending)
             for hunk in fp.hunks
             for (kind, text), ending in zip(hunk.lines, hunk.endings or (None,) * len(hunk.lines))
             if kind == "+"]
    out = [text + (_LF if ending is None else ending.encode()) for text, ending in added]  # unknown: LF
    if out and fp.hunks[-1].target_no_newline:
        out[-1] = added[-1][0]
    return (BOM if any(hunk.target_bom for hunk in fp.hunks) else b"") + b"".join(out)


def _scan_whole(fp: FilePatch, original: bytes | None) -> tuple[HunkState, str]:
    """State of a creation or deletion patch, and the reason when it conflicts."""
    if fp.is_new:
        if original is None:
            return HunkState.NOT_APPLIED, ""
        if _whole_file_matches(_split_file(original), _whole_image(fp.hunks, " +")):
            return HunkState.APPLIED, ""
        return HunkState.CONFLICT, "the patch creates this file, but it already exists with other content"
    if original is None:
        return HunkState.APPLIED, ""
    if _whole_file_matches(_split_file(original), _whole_image(fp.hunks, " -")):
        return HunkState.NOT_APPLIED, ""
    return HunkState.CONFLICT, "the patch deletes this file, but its content differs from what the patch removes"
