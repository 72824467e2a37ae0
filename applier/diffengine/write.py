"""Writing diffs: a byte-faithful git-style unified diff between two versions of a file."""
from __future__ import annotations

import difflib

from applier.diffengine.lines import _LF, _encode

_NO_NEWLINE_MARKER = "\\ No newline at end of file"


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
