"""Locating hunks: the images of a hunk, the shapes it is searched in (fuzz, anchors), finding each hunk in a
file in order, and the per-hunk report."""
from __future__ import annotations

from dataclasses import dataclass

from applier.diffengine.lines import _FileLines, _encode, _key
from applier.diffengine.model import FilePatch, Hunk, HunkReport, HunkState
from applier.errors import RefusedError

# Positions tried in one file while locating one patch's hunks, at most. A catalog's hunk is found in a few tries;
# parse.MAX_HUNKS hunks made of lines the file holds everywhere could otherwise try every line for every hunk.
MAX_POSITIONS_TRIED = 5_000_000


class TooCostlyToLocate(RefusedError):
    """Locating a patch's hunks in a file tried more than MAX_POSITIONS_TRIED positions (exit 3)."""

@dataclass(frozen=True)
class _Image:
    """One side of a hunk, prepared for matching."""
    keys: tuple[bytes, ...]
    endings: tuple[bytes | None, ...]  # the patch's ending per image line; None: unknown
    no_newline: bool
    base: int                          # 0-based index where the header puts the image
    contents: tuple[bytes, ...] = ()   # each line's own bytes (a kept trailing b"\r" included); () if unknown

    def __len__(self) -> int:
        return len(self.keys)


def _images(hunk: Hunk) -> tuple[_Image, _Image]:
    endings = hunk.endings or (None,) * len(hunk.lines)

    def build(kinds: str, start: int, length: int, no_newline: bool) -> _Image:
        positions = tuple(i for i, (kind, _) in enumerate(hunk.lines) if kind in kinds)
        contents = tuple(_encode(hunk.lines[i][1]) for i in positions)
        keys = tuple(_key(content) for content in contents)
        image_endings = tuple(None if endings[i] is None else endings[i].encode() for i in positions)
        # the header gives the first line for a non-empty image, the line *after which* to insert for an empty one
        base = start - 1 if length > 0 else start
        return _Image(keys, image_endings, no_newline, max(base, 0), contents)

    return (build(" -", hunk.source_start, hunk.source_length, hunk.source_no_newline),
            build(" +", hunk.target_start, hunk.target_length, hunk.target_no_newline))


def _context_counts(hunk: Hunk) -> tuple[int, int]:
    kinds = [kind for kind, _ in hunk.lines]
    changed = [i for i, kind in enumerate(kinds) if kind != " "]
    if not changed:
        return len(kinds), len(kinds)
    return changed[0], len(kinds) - 1 - changed[-1]


@dataclass(frozen=True)
class _Shape:
    """How a hunk is searched at one fuzz level."""
    fuzz: int
    drop_start: int       # leading context lines ignored
    drop_end: int         # trailing context lines ignored
    anchor_start: bool    # must match at the first line of the file
    anchor_end: bool      # must match at the last line of the file


def _shapes(hunk: Hunk, max_fuzz: int) -> list[_Shape]:
    lead, trail = _context_counts(hunk)
    context = max(lead, trail)
    at_eof = hunk.source_no_newline or hunk.target_no_newline
    smallest_image = min(sum(kind in " -" for kind, _ in hunk.lines), sum(kind in " +" for kind, _ in hunk.lines))
    shapes: list[_Shape] = []
    seen = set()
    for fuzz in range(max_fuzz + 1):
        # GNU patch: missing context on one side means the hunk sits at that end of the file.
        prefix_fuzz = fuzz + lead - context
        suffix_fuzz = fuzz + trail - context
        anchor_start = prefix_fuzz < 0 and hunk.source_start <= 1
        anchor_end = suffix_fuzz < 0 or at_eof
        drop_start = min(max(prefix_fuzz, 0), lead)
        drop_end = 0 if at_eof else min(max(suffix_fuzz, 0), trail)
        if fuzz > 0 and smallest_image - drop_start - drop_end <= 0:
            break  # an image with no line left would match anywhere: that is no evidence
        signature = (drop_start, drop_end, anchor_start, anchor_end)
        if signature in seen:
            continue
        seen.add(signature)
        shapes.append(_Shape(fuzz, drop_start, drop_end, anchor_start, anchor_end))
    return shapes


def _reduced(image: _Image, shape: _Shape) -> tuple[int, int]:
    """The slice of the image left after dropping context: (first, stop) indices into the image."""
    stop = len(image) - shape.drop_end
    return min(shape.drop_start, stop), stop


def _matches_at(file: _FileLines, image: _Image, first: int, stop: int, pos: int,
                wanted: list[bytes] | None = None) -> bool:
    size = stop - first
    end = pos + size
    if file.keys[pos:end] != (list(image.keys[first:stop]) if wanted is None else wanted):
        return False
    touches_eof = end == file.count
    includes_last = stop == len(image)
    if size == 0:
        # inserting after a last line that has no newline would glue lines together
        return not (touches_eof and file.count and not file.endings[-1] and pos > 0)
    if touches_eof:
        file_no_newline = file.endings[-1] == b""
        expected_no_newline = image.no_newline and includes_last
        return file_no_newline == expected_no_newline
    return not (image.no_newline and includes_last)


def _locate(file: _FileLines, image: _Image, first: int, stop: int, shape: _Shape, lo: int,
            expected: int) -> int | None:
    """Nearest position >= lo where image[first:stop] matches; None if nowhere."""
    size = stop - first
    highest = file.count - size
    if highest < lo:
        return None
    wanted = list(image.keys[first:stop])
    if shape.anchor_start or shape.anchor_end:
        candidates = []
        if shape.anchor_start and shape.anchor_end:
            candidates = [0] if highest == 0 and lo <= 0 else []
        elif shape.anchor_start:
            candidates = [0] if lo <= 0 else []
        else:
            candidates = [highest]
        for pos in candidates:
            if _matches_at(file, image, first, stop, pos, wanted):
                return pos
        return None
    expected = min(max(expected, lo), highest)
    for pos in _candidates(file, image, first, stop, lo, highest, expected):
        file.positions_tried += 1
        if file.positions_tried > MAX_POSITIONS_TRIED:
            raise TooCostlyToLocate(f"locating the patch's hunks tried more than {MAX_POSITIONS_TRIED} positions "
                                    "in the file", hint="a diff this costly to place is not a catalog's: nothing "
                                                        "was changed; split the patch, or give its hunks more context")
        if _matches_at(file, image, first, stop, pos, wanted):
            return pos
    return None


def _candidates(file: _FileLines, image: _Image, first: int, stop: int, lo: int, highest: int, expected: int):
    """The positions in lo..highest where image[first:stop] may match, nearest the expected one first (on equal
    distance the earlier). A match lines up every line of the image, its rarest line in the file included: only
    the places of that line are candidates, so a hunk found nowhere costs a lookup, not a pass over the file."""
    if stop == first:   # an empty image matches almost anywhere: outward from the expected position
        for distance in range(0, max(expected - lo, highest - expected) + 1):
            for pos in ((expected - distance, expected + distance) if distance else (expected,)):
                if lo <= pos <= highest:
                    yield pos
        return
    shift, places = min(((i - first, file.lines_with_key(image.keys[i])) for i in range(first, stop)),
                        key=lambda candidate: len(candidate[1]))
    starts = (place - shift for place in places)
    yield from sorted((pos for pos in starts if lo <= pos <= highest), key=lambda pos: (abs(pos - expected), pos))


def _exact(file: _FileLines, image: _Image, first: int, stop: int, pos: int) -> bool:
    """Do the patch's own bytes agree with the file's at a match, line endings and a trailing b"\r" of a line's
    content included? (Vacuously so for no line.)"""
    for i in range(first, stop):
        ending = image.endings[i]
        if ending is None or file.endings[pos + i - first] != ending:
            return False
        if image.contents and file.contents[pos + i - first] != image.contents[i]:
            return False
    return True


@dataclass(frozen=True)
class _Finding:
    state: HunkState
    pos: int | None = None            # where the reduced image starts in the file
    size: int = 0                     # lines of the file it covers
    shape: _Shape | None = None
    exact: bool = False
    offset: int = 0
    note: str = ""


def _find_hunk(file: _FileLines, hunk: Hunk, lo: int, delta: int, max_fuzz: int) -> _Finding:
    pre, post = _images(hunk)
    expected = pre.base + delta
    same = (pre.keys == post.keys and pre.no_newline == post.no_newline and pre.endings == post.endings
            and pre.contents == post.contents)
    for shape in _shapes(hunk, max_fuzz):
        pre_first, pre_stop = _reduced(pre, shape)
        post_first, post_stop = _reduced(post, shape)
        want = expected + shape.drop_start
        pre_pos = _locate(file, pre, pre_first, pre_stop, shape, lo, want)
        post_pos = _locate(file, post, post_first, post_stop, shape, lo, want)
        if pre_pos is None and post_pos is None:
            continue
        pre_exact = pre_pos is not None and _exact(file, pre, pre_first, pre_stop, pre_pos)
        post_exact = post_pos is not None and _exact(file, post, post_first, post_stop, post_pos)
        if same:
            choose_post = True
        elif pre_pos is None:
            choose_post = True
        elif post_pos is None:
            choose_post = False
        else:
            pre_distance, post_distance = abs(pre_pos - want), abs(post_pos - want)
            pre_empty, post_empty = pre_stop == pre_first, post_stop == post_first
            if pre_distance != post_distance:
                choose_post = post_distance < pre_distance
            elif pre_empty != post_empty:
                # an empty image (a hunk without context that only adds or only removes) matches anywhere
                choose_post = pre_empty
            elif pre_exact != post_exact:
                choose_post = post_exact
            else:
                # Nothing tells the two apart (repeated lines): guessing "applied" could skip a needed change,
                # guessing "not applied" could apply it twice. Refuse and say why.
                where = (f"line {pre_pos + 1}" if pre_pos == post_pos
                         else f"lines {pre_pos + 1} and {post_pos + 1}")
                return _Finding(state=HunkState.CONFLICT, note=(
                    f"ambiguous: both the original lines and the patched lines match ({where}), equally near the "
                    "expected place; cannot tell whether this hunk is already applied"))
        if choose_post:
            pos, first, stop, exact, state = post_pos, post_first, post_stop, post_exact, HunkState.APPLIED
        else:
            pos, first, stop, exact, state = pre_pos, pre_first, pre_stop, pre_exact, HunkState.NOT_APPLIED
        return _Finding(state=state, pos=pos, size=stop - first, shape=shape, exact=exact,
                        offset=pos - shape.drop_start - pre.base)
    return _Finding(state=HunkState.CONFLICT)


def _scan(fp: FilePatch, file: _FileLines, max_fuzz: int) -> list[_Finding]:
    try:
        return _scan_in_order(fp, file, max_fuzz)
    except TooCostlyToLocate as exc:
        raise TooCostlyToLocate(f"{fp.path}: {exc.message}", hint=exc.hint) from None


def _scan_in_order(fp: FilePatch, file: _FileLines, max_fuzz: int) -> list[_Finding]:
    findings: list[_Finding] = []
    lo = 0
    delta = 0
    for hunk in fp.hunks:
        finding = _find_hunk(file, hunk, lo, delta, max_fuzz)
        findings.append(finding)
        if finding.state is HunkState.CONFLICT:
            continue
        pre, post = _images(hunk)
        expected = pre.base + delta
        nominal_start = finding.pos - finding.shape.drop_start
        delta += nominal_start - expected
        if finding.state is HunkState.APPLIED:
            delta += len(post) - len(pre)
        lo = finding.pos + finding.size
    return findings


def _report(fp: FilePatch, hunk: Hunk, finding: _Finding) -> HunkReport:
    if finding.state is HunkState.CONFLICT:
        return HunkReport(fp.path, hunk.index, finding.state, None, note=finding.note)
    notes = [finding.note] if finding.note else []
    if finding.offset:
        notes.append(f"offset {finding.offset:+d} lines")
    if finding.shape.fuzz:
        notes.append(f"fuzz {finding.shape.fuzz}")
    if finding.state is HunkState.APPLIED:
        notes.insert(0, "already applied")
    return HunkReport(fp.path, hunk.index, finding.state, finding.pos + 1, offset=finding.offset,
                      fuzz=finding.shape.fuzz, note="; ".join(notes))
