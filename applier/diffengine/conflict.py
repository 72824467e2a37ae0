"""Conflicts: building the HunkConflict of a hunk that does not apply, with the file's best near-match."""
from __future__ import annotations

import difflib
import heapq
from collections import Counter

from applier.diffengine.lines import _FileLines, _display, _encode, _key
from applier.diffengine.locate import _Finding, _Shape, _images, _locate
from applier.diffengine.model import FilePatch, HunkState
from applier.errors import HunkConflict

# The near-match of a conflict: how many windows get the costly similarity ratio, and how long a line counts.
_NEAR_MATCH_CANDIDATES = 25
_NEAR_MATCH_SPAN = 40
_NEAR_MATCH_LINE_CHARS = 240


def _display_lines(texts: list[str]) -> list[str]:
    return [_display(text) for text in texts]


def _conflict(fp: FilePatch, index: int, file: _FileLines, findings: list[_Finding], fuzz: int) -> HunkConflict:
    hunk = fp.hunks[index]
    expected = _display_lines(hunk.before)
    reason = "neither the lines the hunk changes nor the lines it produces were found"
    reason += f" (fuzz up to {fuzz} tried)" if fuzz else " (no fuzz allowed)"
    previous = [f for f in findings[:index] if f.state is not HunkState.CONFLICT]
    if findings[index].note:
        reason = findings[index].note
    elif previous:
        # Found only before the end of the previous hunk? Then the order/overlap is what fails; say so.
        pre, _ = _images(hunk)
        anywhere = _locate(file, pre, 0, len(pre), _Shape(0, 0, 0, False, False), 0, pre.base)
        end_previous = previous[-1].pos + previous[-1].size
        if anywhere is not None and anywhere < end_previous:
            reason = (f"its lines appear only at line {anywhere + 1}, before the end of the previous hunk "
                      "(hunks must apply in order without overlapping)")
    near_line, near_text = _near_match(file, expected, _images(hunk)[0].base)
    return HunkConflict(fp.path, hunk.index, hunk.header, expected, near_line, near_text, reason)


def _near_match(file: _FileLines, expected: list[str], around: int = 0) -> tuple[int | None, list[str]]:
    """The window of the file most similar to the expected lines (difflib ratio), with its 1-based line.

    The ratio is costly on big files, so it is computed only for the windows sharing the most whole lines with
    the expected ones and for those near the expected place."""
    if not file.count or not expected:
        return None, []
    size = min(len(expected), file.count)
    wanted_keys = Counter(_key(_encode(text)) for text in expected)
    window: Counter = Counter()
    shared = 0
    scored: list[tuple[int, int, int]] = []  # (-shared lines, distance to `around`, position)
    for index, key in enumerate(file.keys):
        if window[key] < wanted_keys[key]:
            shared += 1
        window[key] += 1
        if index >= size:
            leaving = file.keys[index - size]
            window[leaving] -= 1
            if window[leaving] < wanted_keys[leaving]:
                shared -= 1
        if index >= size - 1:
            pos = index - size + 1
            scored.append((-shared, abs(pos - around), pos))
    candidates = {pos for score, _, pos in heapq.nsmallest(_NEAR_MATCH_CANDIDATES, scored) if score < 0}
    candidates |= set(range(max(0, around - _NEAR_MATCH_SPAN), min(file.count - size, around + _NEAR_MATCH_SPAN) + 1))
    lines = [_display(content)[:_NEAR_MATCH_LINE_CHARS] for content in file.contents]
    matcher = difflib.SequenceMatcher(None, autojunk=False)
    matcher.set_seq2("\n".join(text[:_NEAR_MATCH_LINE_CHARS] for text in expected))
    best: tuple[float, int] | None = None
    for pos in sorted(candidates, key=lambda p: (abs(p - around), p)):
        matcher.set_seq1("\n".join(lines[pos:pos + size]))
        if best is not None and matcher.quick_ratio() <= best[0]:
            continue
        ratio = matcher.ratio()
        if best is None or ratio > best[0]:
            best = (ratio, pos)
    if best is None or best[0] == 0.0:
        return None, []
    pos = best[1]
    return pos + 1, [_display(content) for content in file.contents[pos:pos + size]]
