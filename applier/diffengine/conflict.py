"""Conflicts: building the HunkConflict of a hunk that does not apply, with the file's best near-match."""
from __future__ import annotations

import difflib
import heapq
from collections import Counter

from applier.diffengine.lines import _FileLines, _display, _encode, _key
from applier.diffengine.locate import _Finding, _Shape, _images, _locate
from applier.diffengine.model import FilePatch, HunkState
from applier.errors import HunkConflict

# The near-match of a conflict. Every window of the file (as many lines as the hunk expects) gets a cheap score in
# one pass: how many of the expected lines it holds, whitespace aside. Only a bounded set of windows then gets
# difflib's ratio, over lines (never characters: a character ratio of two 150-line windows alone can take seconds):
# windows placed by exact occurrences of the hunk's rarest lines, the best-scoring windows, and those next to the
# expected place. The cost is linear in the file's size plus a bounded number of line comparisons.
_NEAR_MATCH_ANCHORS = 48        # windows placed by occurrences of the hunk's rarest lines
_NEAR_MATCH_TOP = 16            # windows holding the most expected lines
_NEAR_MATCH_SPAN = 8            # windows on each side of the expected place
_NEAR_MATCH_LINE_BUDGET = 60_000  # window lines given to difflib in all (bounds the cost of very long hunks)
_NEAR_MATCH_LINE_CHARS = 240    # how much of a line counts


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


def _normal(line: bytes) -> bytes:
    """A line as the near-match compares it: whitespace aside (a re-indented block is still near), and capped."""
    return b"".join(line[:_NEAR_MATCH_LINE_CHARS].split())


def _near_match(file: _FileLines, expected: list[str], around: int = 0) -> tuple[int | None, list[str]]:
    """The window of the file most like the expected lines, with its 1-based line; (None, []) when no window shares
    a line with them, whitespace aside. `around` is where the hunk was expected (0-based): nearer wins a tie."""
    if not file.count or not expected:
        return None, []
    size = min(len(expected), file.count)
    highest = file.count - size
    around = min(max(around, 0), highest)
    lines = [_normal(key) for key in file.keys]
    wanted = [_normal(_key(_encode(text))) for text in expected]
    shared = _shared_line_counts(lines, wanted, size)
    candidates = _candidate_windows(lines, wanted, shared, size, around)
    if not candidates:
        return None, []
    matcher = difflib.SequenceMatcher(None)
    matcher.set_seq2(wanted)
    best: tuple[float, int, int] | None = None  # (ratio, -distance, -position): the largest wins
    for pos in candidates:
        matcher.set_seq1(lines[pos:pos + size])
        if best is not None and matcher.real_quick_ratio() < best[0]:
            continue
        if best is not None and matcher.quick_ratio() < best[0]:
            continue
        score = (matcher.ratio(), -abs(pos - around), -pos)
        if best is None or score > best:
            best = score
    pos = -best[2]
    return pos + 1, [_display(content) for content in file.contents[pos:pos + size]]


def _shared_line_counts(lines: list[bytes], wanted: list[bytes], size: int) -> list[int]:
    """For each window start: how many non-blank expected lines the window holds (as a multiset), in one pass."""
    wanted_counts = Counter(line for line in wanted if line)
    window: Counter = Counter()
    shared = 0
    counts: list[int] = []
    for index, line in enumerate(lines):
        if line in wanted_counts:
            if window[line] < wanted_counts[line]:
                shared += 1
            window[line] += 1
        if index >= size:
            leaving = lines[index - size]
            if leaving in wanted_counts:
                window[leaving] -= 1
                if window[leaving] < wanted_counts[leaving]:
                    shared -= 1
        if index >= size - 1:
            counts.append(shared)
    return counts


def _candidate_windows(lines: list[bytes], wanted: list[bytes], shared: list[int], size: int,
                       around: int) -> list[int]:
    """The window starts worth a difflib ratio, most promising first; only windows sharing a line qualify."""
    highest = len(shared) - 1
    occurrences: dict[bytes, list[int]] = {line: [] for line in wanted if line}
    for index, line in enumerate(lines):
        if line in occurrences:
            occurrences[line].append(index)
    windows: set[int] = set()
    # A rare line found exactly says where the whole hunk would sit: line j of the hunk at file line i.
    rarest = sorted((len(occurrences[line]), j) for j, line in enumerate(wanted) if line and occurrences[line])
    for count, j in rarest:
        if len(windows) + count > _NEAR_MATCH_ANCHORS:
            break  # the rest are common lines: they place windows everywhere and say little
        windows.update(min(max(i - j, 0), highest) for i in occurrences[wanted[j]])
    windows.update(heapq.nlargest(_NEAR_MATCH_TOP, range(highest + 1), key=lambda p: (shared[p], -abs(p - around))))
    windows.update(range(max(0, around - _NEAR_MATCH_SPAN), min(highest, around + _NEAR_MATCH_SPAN) + 1))
    ordered = sorted((p for p in windows if shared[p] > 0), key=lambda p: (-shared[p], abs(p - around), p))
    return ordered[:max(_NEAR_MATCH_TOP, _NEAR_MATCH_LINE_BUDGET // size)]
