r"""The diff engine: pure functions, bytes in, bytes out, no file system.

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

    Also public (all pure):
    scan_file(fp, original, *, reverse=False, fuzz=0) -> tuple[HunkReport, ...]     per-hunk states, never raises
    reverse_file_patch(fp) -> FilePatch                                             the undoing patch
    apply_patch_to_files(patches, files, *, reverse=False, fuzz=0) -> list[FilePlan]
    unified_diff(old: bytes | None, new: bytes | None, path, *, context=3) -> bytes  a byte-faithful git-style diff
    classify_file and plan_file also take reverse= and fuzz= (a file applied with fuzz is recognised with fuzz).

RULES (what "present", "found" and "ending" mean here):

* Line model. A file is split on b"\n" only; every line keeps its own ending: b"\n", b"\r\n", or b"" for a final
  line without newline. A lone b"\r" is content. A UTF-8 BOM is held apart from the lines and written back as it
  was (a patch does not add or remove a BOM of an existing file). Text is never decoded for matching: the patch is
  decoded as UTF-8 with surrogateescape, so its lines encode back to the exact bytes.
* Matching. A hunk line matches a file line when both are equal after dropping the ending and one trailing b"\r",
  so an LF patch matches a CRLF file and the reverse. The final newline is strict: an image whose last line is
  marked "\ No newline at end of file" only matches at the end of a file whose last line has no ending, and an
  image without the marker never matches a last line without ending. A match is "exact" when, in addition, every
  line ending the patch carries equals the file's (a CRLF-transported patch, recognised by its CRLF "@@" headers,
  carries no ending information).
* Locating a hunk. The expected line is the header's line plus the running offset of the hunks before it. Each
  image (pre and post) is searched at the expected line, then outward (smallest distance first; on equal distance
  the earlier line), never before the end of the previous hunk, so hunks apply in order without overlap. As in GNU
  patch, a hunk with less leading than trailing context that starts at line 1 is anchored to the start of the file,
  and one with less trailing than leading context (or a "No newline" marker) to its end. Only when fuzz > 0 is
  allowed and nothing was found: drop up to `fuzz` context lines at both ends (GNU's rule) and search again; the
  fuzz used is reported. HunkReport.line is the first file line matched (for a hunk without lines: the line it
  goes before); HunkReport.offset is where the whole hunk landed minus its header line.
* Classifying a hunk. Only the pre-image found => NOT_APPLIED; only the post-image => APPLIED; neither =>
  CONFLICT. Both found: the one nearer the expected line wins; on equal distance a non-empty image beats an
  empty one (a hunk without context matches anywhere), then an exact match beats a loose one (this tells apart
  hunks that only change line endings). A full tie is CONFLICT with a note starting "ambiguous": with repeated
  lines nothing tells "applied" from "not applied", and guessing could skip a change or apply it twice.
* Endings of inserted lines. When the pre-image matched exactly, the patch's own endings are used (a faithful
  diff of a mixed-ending file round-trips byte for byte). Otherwise an inserted line takes the ending of the line it
  replaces, else of the line before it, else of the line after it, else the file's dominant ending; LF when the
  file has none. New files take the patch's endings, LF where the patch carries none.
* Whole files. Creation: file absent => NOT_APPLIED; present with the same lines => APPLIED; else CONFLICT.
  Deletion: absent => APPLIED; the whole content equal to the removed lines => NOT_APPLIED; else CONFLICT.
* plan_file refuses (HunkConflict) when any hunk is in CONFLICT. A file where every hunk is APPLIED gives
  new == old. A PARTIAL file (some applied, the others applicable) gets the applicable hunks applied; both kinds
  are reported.
"""
from __future__ import annotations

import difflib
import enum
import heapq
from collections import Counter
from dataclasses import dataclass, field

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from applier.errors import DiffParseError, HunkConflict

BOM = b"\xef\xbb\xbf"
DEV_NULL = "/dev/null"
_LF = b"\n"
_CRLF = b"\r\n"
_NO_NEWLINE_MARKER = "\\ No newline at end of file"
# Lines of a git extended header that describe operations we do not perform.
_UNSUPPORTED_HEADERS = (
    ("rename from", "a rename"), ("rename to", "a rename"),
    ("copy from", "a copy"), ("copy to", "a copy"),
    ("similarity index", "a rename or copy"), ("dissimilarity index", "a rewrite with rename"),
    ("old mode", "a file mode change"), ("new mode", "a file mode change"),
)
_UNSUPPORTED_MODES = {"120000": "a symbolic link", "160000": "a git submodule"}
# The near-match of a conflict: how many windows get the costly similarity ratio, and how long a line counts.
_NEAR_MATCH_CANDIDATES = 25
_NEAR_MATCH_SPAN = 40
_NEAR_MATCH_LINE_CHARS = 240


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


# ---------------------------------------------------------------------------------------------------------------
# Parsing


def parse_patch(data: bytes) -> list[FilePatch]:
    """Parse a unified diff (git or plain) into one FilePatch per file. Raises DiffParseError."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if not data.strip():
        raise DiffParseError("the patch is empty")
    text = data.decode("utf-8", "surrogateescape")
    if text.startswith("\ufeff"):  # a patch file saved with a BOM
        text = text[1:]
    raw_lines = _split_keep_lf(text)
    # unidiff reads LF-terminated lines; remember which lines carried CRLF so the patch's endings stay known.
    crlf = [line.endswith("\r\n") for line in raw_lines]
    normalized = [line[:-2] + "\n" if is_crlf else line for line, is_crlf in zip(raw_lines, crlf)]
    for number, line in enumerate(normalized, 1):
        if line.startswith("GIT binary patch") or (line.startswith("Binary files ") and " differ" in line):
            raise DiffParseError(f"binary diffs are not supported (patch line {number}: {line.strip()})")
    hunk_headers = [i for i, line in enumerate(normalized) if line.startswith("@@ ")]
    # git and diff write their own lines with LF; CRLF on every @@ line means the whole patch was converted in
    # transit (an editor, autocrlf), so the endings of its content lines say nothing about the files.
    transported_crlf = bool(hunk_headers) and all(crlf[i] for i in hunk_headers)
    try:
        patch_set = PatchSet(normalized)
    except UnidiffParseError as exc:
        raise DiffParseError(f"the patch is not a valid unified diff: {exc}") from None
    if not patch_set:
        raise DiffParseError("the patch contains no file differences (not a unified diff?)")
    return [_convert_file(patched, raw_lines, transported_crlf) for patched in patch_set]


def _split_keep_lf(text: str) -> list[str]:
    """Split on "\\n" only (str.splitlines would also split on \\r, \\x0c, \\u2028 ...)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _clean_path(name: str) -> str:
    name = name.strip()
    if len(name) >= 2 and name.startswith('"') and name.endswith('"'):
        inner = name[1:-1]
        if "\\" in inner:
            raise DiffParseError(f"quoted path with escapes is not supported: {name}")
        name = inner
    return name


def _strip_prefix(name: str, prefix: str, git_style: bool) -> str:
    if name == DEV_NULL:
        return name
    if git_style:
        # git uses a/ b/ (or mnemonic prefixes such as i/ w/ c/ o/, or 1/ 2/): one path component to drop.
        if len(name) > 2 and name[1] == "/" and name[0] in "abciow12":
            return name[2:]
        return name
    return name[2:] if name.startswith(prefix) else name


def _convert_file(patched, raw_lines: list[str], transported_crlf: bool) -> FilePatch:
    source = _clean_path(patched.source_file or "")
    target = _clean_path(patched.target_file or "")
    git_style = bool(patched.patch_info) and any(line.startswith("diff --git ") for line in patched.patch_info)
    if not git_style:
        # a plain diff strips a/ and b/ only when both sides use them (or one side is /dev/null)
        plain_prefixed = ((source.startswith("a/") or source == DEV_NULL)
                          and (target.startswith("b/") or target == DEV_NULL))
        if plain_prefixed:
            source, target = _strip_prefix(source, "a/", False), _strip_prefix(target, "b/", False)
    else:
        source, target = _strip_prefix(source, "a/", True), _strip_prefix(target, "b/", True)
    label = target if target != DEV_NULL else source
    if patched.is_binary_file:
        raise DiffParseError(f"{label}: binary diffs are not supported")
    for line in patched.patch_info or ():
        for keyword, what in _UNSUPPORTED_HEADERS:
            if line.startswith(keyword + " "):
                raise DiffParseError(f"{label}: the patch describes {what} ({line.strip()}), which is not supported")
    for mode in (patched.source_mode, patched.target_mode):
        if mode in _UNSUPPORTED_MODES:
            raise DiffParseError(f"{label}: the patch changes {_UNSUPPORTED_MODES[mode]}, which is not supported")
    is_new = source == DEV_NULL
    is_deleted = target == DEV_NULL
    if is_new and is_deleted:
        raise DiffParseError("a file diff with /dev/null on both sides")
    if not is_new and not is_deleted and source != target:
        raise DiffParseError(f"source path {source!r} and target path {target!r} differ: renames are not supported",
                             hint="write the diff with the same path on both sides (a/PATH, b/PATH)")
    if not label:
        raise DiffParseError("a file diff without a path")
    if not patched and not (is_new or is_deleted):
        raise DiffParseError(f"{label}: the file diff has no hunks (a mode-only change?)")
    hunks = tuple(_convert_hunk(label, index, hunk, raw_lines, transported_crlf)
                  for index, hunk in enumerate(patched, 1))
    for hunk in hunks:
        kinds = {kind for kind, _ in hunk.lines}
        if is_new and kinds - {"+"}:
            raise DiffParseError(f"{label}: hunk #{hunk.index} of a new file has context or removed lines")
        if is_deleted and kinds - {"-"}:
            raise DiffParseError(f"{label}: hunk #{hunk.index} of a deleted file has context or added lines")
    for hunk in hunks[:-1]:
        if hunk.source_no_newline or hunk.target_no_newline:
            raise DiffParseError(f"{label}: hunk #{hunk.index} has a 'No newline at end of file' marker but "
                                 "is not the last hunk")
    return FilePatch(path=label, is_new=is_new, is_deleted=is_deleted, hunks=hunks)


def _convert_hunk(path: str, index: int, hunk, raw_lines: list[str], transported_crlf: bool) -> Hunk:
    kinds: list[str] = []
    texts: list[str] = []
    endings: list[str | None] = []
    source_no_newline = target_no_newline = False
    source_bom = target_bom = False
    for line in hunk:
        kind = line.line_type
        if kind == "":
            continue  # a blank separator line after the hunk, attached by unidiff
        if kind == "\\":
            if not kinds:
                raise DiffParseError(f"{path}: hunk #{index} starts with a 'No newline' marker")
            previous = kinds[-1]
            source_no_newline |= previous in (" ", "-")
            target_no_newline |= previous in (" ", "+")
            endings[-1] = ""
            continue
        value = line.value
        text = value[:-1] if value.endswith("\n") else value
        if line.diff_line_no is None or not value.endswith("\n"):
            ending = None  # the patch text was cut short: no ending information
        elif transported_crlf:
            ending = None
        else:
            ending = "\r\n" if raw_lines[line.diff_line_no - 1].endswith("\r\n") else "\n"
        # The BOM belongs to the file, not to its first line: keep it out of the text, remember it.
        if text.startswith("\ufeff"):
            at_source_line_1 = kind in (" ", "-") and line.source_line_no == 1
            at_target_line_1 = kind in (" ", "+") and line.target_line_no == 1
            if at_source_line_1 or at_target_line_1:
                text = text[1:]
                source_bom |= at_source_line_1
                target_bom |= at_target_line_1
        kinds.append(kind)
        texts.append(text)
        endings.append(ending)
    # a marker must follow the last line of its image
    if source_no_newline and _last_of(kinds, " -") != _marker_owner(hunk, " -"):
        raise DiffParseError(f"{path}: hunk #{index}: 'No newline' marker before the end of the old lines")
    if target_no_newline and _last_of(kinds, " +") != _marker_owner(hunk, " +"):
        raise DiffParseError(f"{path}: hunk #{index}: 'No newline' marker before the end of the new lines")
    section = f" {hunk.section_header}" if hunk.section_header else ""
    header = (f"@@ -{hunk.source_start},{hunk.source_length} "
              f"+{hunk.target_start},{hunk.target_length} @@{section}")
    return Hunk(index=index, source_start=hunk.source_start, source_length=hunk.source_length,
                target_start=hunk.target_start, target_length=hunk.target_length, header=header,
                lines=tuple(zip(kinds, texts)), source_no_newline=source_no_newline,
                target_no_newline=target_no_newline, endings=tuple(endings),
                source_bom=source_bom, target_bom=target_bom)


def _last_of(kinds: list[str], wanted: str) -> int:
    positions = [i for i, kind in enumerate(kinds) if kind in wanted]
    return positions[-1] if positions else -1


def _marker_owner(hunk, wanted: str) -> int:
    """Index (among content lines) of the last line of `wanted` kinds followed by a 'No newline' marker."""
    owner = -1
    content_index = -1
    previous_kind = None
    for line in hunk:
        if line.line_type == "":
            continue
        if line.line_type == "\\":
            if previous_kind is not None and previous_kind in wanted:
                owner = content_index
            continue
        content_index += 1
        previous_kind = line.line_type
    return owner


# ---------------------------------------------------------------------------------------------------------------
# Reversing


def reverse_file_patch(fp: FilePatch) -> FilePatch:
    """The patch that undoes `fp`: before and after swapped, creation <-> deletion."""
    return FilePatch(path=fp.path, is_new=fp.is_deleted, is_deleted=fp.is_new,
                     hunks=tuple(_reverse_hunk(hunk) for hunk in fp.hunks))


def _reverse_hunk(hunk: Hunk) -> Hunk:
    swap = {"+": "-", "-": "+", " ": " "}
    endings = hunk.endings or (None,) * len(hunk.lines)
    swapped = [(swap[kind], text, ending) for (kind, text), ending in zip(hunk.lines, endings)]
    # keep the usual order inside each block of changes: removed lines first, then added ones
    ordered: list[tuple[str, str, str | None]] = []
    block: list[tuple[str, str, str | None]] = []
    for item in swapped + [(" ", "", None)]:
        if item[0] == " ":
            ordered += [entry for entry in block if entry[0] == "-"] + [entry for entry in block if entry[0] == "+"]
            block = []
            ordered.append(item)
        else:
            block.append(item)
    ordered.pop()
    section = hunk.header.split("@@", 2)[2] if hunk.header.count("@@") >= 2 else ""
    header = (f"@@ -{hunk.target_start},{hunk.target_length} "
              f"+{hunk.source_start},{hunk.source_length} @@{section}")
    return Hunk(index=hunk.index, source_start=hunk.target_start, source_length=hunk.target_length,
                target_start=hunk.source_start, target_length=hunk.source_length, header=header,
                lines=tuple((kind, text) for kind, text, _ in ordered),
                source_no_newline=hunk.target_no_newline, target_no_newline=hunk.source_no_newline,
                endings=tuple(ending for _, _, ending in ordered) if hunk.endings else (),
                source_bom=hunk.target_bom, target_bom=hunk.source_bom)


# ---------------------------------------------------------------------------------------------------------------
# The file as lines


@dataclass
class _FileLines:
    has_bom: bool
    contents: list[bytes]          # each line without its ending
    endings: list[bytes]           # b"\n", b"\r\n" or b"" (only the last line)
    keys: list[bytes]              # what matching compares

    @property
    def count(self) -> int:
        return len(self.contents)

    def dominant_ending(self) -> bytes:
        counts = Counter(ending for ending in self.endings if ending)
        if counts[_CRLF] > counts[_LF]:
            return _CRLF
        return _LF

    def render(self, lines: list[tuple[bytes, bytes]]) -> bytes:
        return (BOM if self.has_bom else b"") + b"".join(content + ending for content, ending in lines)


def _key(content: bytes) -> bytes:
    return content[:-1] if content.endswith(b"\r") else content


def _split_file(data: bytes) -> _FileLines:
    has_bom = data.startswith(BOM)
    body = data[len(BOM):] if has_bom else data
    contents: list[bytes] = []
    endings: list[bytes] = []
    parts = body.split(_LF)
    for part in parts[:-1]:
        if part.endswith(b"\r"):
            contents.append(part[:-1])
            endings.append(_CRLF)
        else:
            contents.append(part)
            endings.append(_LF)
    if parts[-1] or (has_bom and not contents):
        # a final line without newline; a file of only a BOM counts as one empty line without newline, the way a
        # diff of it shows that BOM line
        contents.append(parts[-1])
        endings.append(b"")
    return _FileLines(has_bom, contents, endings, [_key(c) for c in contents])


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _display(text: str | bytes) -> str:
    raw = text if isinstance(text, bytes) else _encode(text)
    return raw.decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------------------------------
# Locating hunks


@dataclass(frozen=True)
class _Image:
    """One side of a hunk, prepared for matching."""
    keys: tuple[bytes, ...]
    endings: tuple[bytes | None, ...]  # the patch's ending per image line; None: unknown
    no_newline: bool
    base: int                          # 0-based index where the header puts the image

    def __len__(self) -> int:
        return len(self.keys)


def _images(hunk: Hunk) -> tuple[_Image, _Image]:
    endings = hunk.endings or (None,) * len(hunk.lines)

    def build(kinds: str, start: int, length: int, no_newline: bool) -> _Image:
        positions = tuple(i for i, (kind, _) in enumerate(hunk.lines) if kind in kinds)
        keys = tuple(_key(_encode(hunk.lines[i][1])) for i in positions)
        image_endings = tuple(None if endings[i] is None else endings[i].encode() for i in positions)
        # the header gives the first line for a non-empty image, the line *after which* to insert for an empty one
        base = start - 1 if length > 0 else start
        return _Image(keys, image_endings, no_newline, max(base, 0))

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
    for distance in range(0, max(expected - lo, highest - expected) + 1):
        for pos in ((expected - distance, expected + distance) if distance else (expected,)):
            if lo <= pos <= highest and _matches_at(file, image, first, stop, pos, wanted):
                return pos
    return None


def _exact(file: _FileLines, image: _Image, first: int, stop: int, pos: int) -> bool:
    """Do the patch's own line endings agree with the file's at a match? (Vacuously so for no line.)"""
    for i in range(first, stop):
        ending = image.endings[i]
        if ending is None or file.endings[pos + i - first] != ending:
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
    same = pre.keys == post.keys and pre.no_newline == post.no_newline and pre.endings == post.endings
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


# ---------------------------------------------------------------------------------------------------------------
# Whole-file patches (creation, deletion)


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


# ---------------------------------------------------------------------------------------------------------------
# Public API


def scan_file(fp: FilePatch, original: bytes | None, *, reverse: bool = False,
              fuzz: int = 0) -> tuple[HunkReport, ...]:
    """One HunkReport per hunk (APPLIED / NOT_APPLIED / CONFLICT), never raising for a conflict."""
    _check_fuzz(fuzz)
    if reverse:
        fp = reverse_file_patch(fp)
    if fp.is_new or fp.is_deleted:
        state, reason = _scan_whole(fp, original)
        line = None if original is None else 1
        return tuple(HunkReport(fp.path, hunk.index, state, line, note=reason) for hunk in fp.hunks)
    if original is None:
        return tuple(HunkReport(fp.path, hunk.index, HunkState.CONFLICT, None, note="the file does not exist")
                     for hunk in fp.hunks)
    file = _split_file(original)
    return tuple(_report(fp, hunk, finding) for hunk, finding in zip(fp.hunks, _scan(fp, file, fuzz)))


def classify_file(fp: FilePatch, original: bytes | None, *, reverse: bool = False, fuzz: int = 0) -> FileState:
    """APPLIED, NOT_APPLIED, PARTIAL (some applied, the rest applicable) or CONFLICT."""
    if reverse:
        fp = reverse_file_patch(fp)
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


def plan_file(fp: FilePatch, original: bytes | None, *, reverse: bool = False, fuzz: int = 0) -> FilePlan:
    """The new bytes of one file (None: delete it) and a report per hunk. Raises HunkConflict."""
    _check_fuzz(fuzz)
    if reverse:
        fp = reverse_file_patch(fp)
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


def apply_patch_to_files(patches: list[FilePatch], files: dict[str, bytes | None], *, reverse: bool = False,
                         fuzz: int = 0) -> list[FilePlan]:
    """Plan every file patch against `files` (path -> bytes, None or missing: absent). A path patched twice sees
    the result of the first patch. Reversing undoes the patches in the opposite order. Raises HunkConflict."""
    current = dict(files)
    ordered = list(reversed(patches)) if reverse else list(patches)
    plans: list[FilePlan] = []
    for fp in ordered:
        plan = plan_file(fp, current.get(fp.path), reverse=reverse, fuzz=fuzz)
        current[fp.path] = plan.new
        plans.append(plan)
    return list(reversed(plans)) if reverse else plans


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


# ---------------------------------------------------------------------------------------------------------------
# Conflicts


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


# ---------------------------------------------------------------------------------------------------------------
# Writing diffs


def unified_diff(old: bytes | None, new: bytes | None, path: str, *, context: int = 3) -> bytes:
    """A git-style unified diff turning `old` into `new` (None: the file is absent), byte-faithful: every line is
    written with its own ending, and a final line without newline gets the "No newline" marker."""
    old_lines = _split_keep_lf_bytes(old or b"")
    new_lines = _split_keep_lf_bytes(new or b"")
    if old == new or (old_lines == new_lines and old is not None and new is not None):
        return b""
    encoded = _encode(path)
    out = [b"diff --git a/" + encoded + b" b/" + encoded + b"\n"]
    if old is None:
        out.append(b"new file mode 100644\n")
    if new is None:
        out.append(b"deleted file mode 100644\n")
    out.append(b"--- " + (b"/dev/null" if old is None else b"a/" + encoded) + b"\n")
    out.append(b"+++ " + (b"/dev/null" if new is None else b"b/" + encoded) + b"\n")
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        first, last = group[0], group[-1]
        out.append(b"@@ -" + _range(first[1], last[2]) + b" +" + _range(first[3], last[4]) + b" @@\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += _diff_lines(b" ", old_lines[i1:i2])
                continue
            if tag in ("replace", "delete"):
                out += _diff_lines(b"-", old_lines[i1:i2])
            if tag in ("replace", "insert"):
                out += _diff_lines(b"+", new_lines[j1:j2])
    return b"".join(out)


def _split_keep_lf_bytes(data: bytes) -> list[bytes]:
    parts = data.split(_LF)
    lines = [part + _LF for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _range(start: int, stop: int) -> bytes:
    length = stop - start
    first = start + 1 if length else start  # an empty range names the line before it
    return f"{first},{length}".encode() if length != 1 else f"{first}".encode()


def _diff_lines(prefix: bytes, lines: list[bytes]) -> list[bytes]:
    out = []
    for line in lines:
        if line.endswith(_LF):
            out.append(prefix + line)
        else:
            out.append(prefix + line + b"\n" + _NO_NEWLINE_MARKER.encode() + b"\n")
    return out


__all__ = [
    "BOM", "FilePatch", "FilePlan", "FileState", "Hunk", "HunkReport", "HunkState", "apply_patch_to_files",
    "classify_file", "parse_patch", "plan_file", "reverse_file_patch", "scan_file", "unified_diff",
]
