"""Parsing: unified diff bytes (git or plain style) into FilePatch records, with `unidiff`."""
from __future__ import annotations

import posixpath

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from applier.diffengine.model import FilePatch, Hunk
from applier.errors import DiffParseError

DEV_NULL = "/dev/null"
# Bounds on one patch (a variant's diffs together): the catalog's diffs are a few kB with a few hunks, and every
# hunk is searched for in its file, so a diff past these is refused before any search (exit 3), not left to run.
MAX_PATCH_BYTES = 1024 * 1024
MAX_HUNKS = 1000
# Lines of a git extended header that describe operations we do not perform.
_UNSUPPORTED_HEADERS = (
    ("rename from", "a rename"), ("rename to", "a rename"),
    ("copy from", "a copy"), ("copy to", "a copy"),
    ("similarity index", "a rename or copy"), ("dissimilarity index", "a rewrite with rename"),
    ("old mode", "a file mode change"), ("new mode", "a file mode change"),
)
_UNSUPPORTED_MODES = {"120000": "a symbolic link", "160000": "a git submodule"}


def parse_patch(data: bytes) -> list[FilePatch]:
    """Parse a unified diff (git or plain) into one FilePatch per file. Raises DiffParseError."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if not data.strip():
        raise DiffParseError("the patch is empty")
    if len(data) > MAX_PATCH_BYTES:
        raise DiffParseError(f"the patch holds {len(data)} bytes, over applier's limit of {MAX_PATCH_BYTES}",
                             hint=SPLIT_HINT)
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
    if len(hunk_headers) > MAX_HUNKS:
        raise DiffParseError(f"the patch has {len(hunk_headers)} hunks, over applier's limit of {MAX_HUNKS}",
                             hint=SPLIT_HINT)
    # git and diff write their own lines with LF; CRLF on every @@ line means the whole patch was converted in
    # transit (an editor, autocrlf), so the endings of its content lines say nothing about the files.
    transported_crlf = bool(hunk_headers) and all(crlf[i] for i in hunk_headers)
    try:
        patch_set = PatchSet(normalized)
    except UnidiffParseError as exc:
        raise DiffParseError(f"the patch is not a valid unified diff: {exc}") from None
    if not patch_set:
        raise DiffParseError("the patch contains no file differences (not a unified diff?)")
    file_patches = [_convert_file(patched, raw_lines, transported_crlf) for patched in patch_set]
    _check_one_section_per_file(file_patches)
    return file_patches


def _check_one_section_per_file(file_patches: list[FilePatch]) -> None:
    """Two sections for one file would be planned one after the other, the second against bytes the first
    already changed (or, by a careless caller, against the original, silently dropping the first): refuse."""
    first_section: dict[str, tuple[int, str]] = {}
    for number, fp in enumerate(file_patches, 1):
        key = posixpath.normpath(fp.path)
        if key in first_section:
            first, path = first_section[key]
            spelled = f", the second spelled {fp.path!r}" if fp.path != path else ""
            raise DiffParseError(
                f"{path}: the patch has two sections for this file (file sections {first} and {number} of the "
                f"patch{spelled})",
                hint="merge them into one section with several hunks (git diff writes one section per file)")
        first_section[key] = (number, fp.path)


SPLIT_HINT = "split it into several smaller patches (nothing was read from the target)"


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
    label = _normal_path(label)
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


def _normal_path(path: str) -> str:
    """The path with its `.` components and repeated slashes dropped (`a/./nodes.py` -> `a/nodes.py`, as patch and
    git read it), so every layer sees one spelling. `..` stays for the path checks to refuse."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts or path.endswith("/"):
        raise DiffParseError(f"{path!r} names a folder, not a file")
    return ("/" if path.startswith("/") else "") + "/".join(parts)


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
            if endings[-1] == "\r\n":
                # A last line without newline is written as its bytes plus the diff's own LF: a CR before that
                # LF belongs to the line (a file ending in "x\r"), unless the whole patch went through a CRLF
                # conversion (then its endings are None and say nothing).
                texts[-1] += "\r"
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
