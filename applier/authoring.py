"""Authoring: a new variant's diff from a pristine upstream file and a hand-edited copy of it."""
from __future__ import annotations

import difflib
import re

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from applier import diffengine
from applier.catalog import Patch, load_patch
from applier.errors import RefusedError
from applier.fsutil import atomic_write


def split_keepends(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True) if data else []


def unified_diff(old: bytes, new: bytes, relpath: str, context: int = 3) -> bytes:
    """A git-style unified diff of two byte strings. Lines keep their own endings (a CRLF file gives CRLF
    lines in the diff); a last line without newline gets the "\\ No newline at end of file" marker."""
    old_lines, new_lines = split_keepends(old), split_keepends(new)
    out = [f"--- a/{relpath}\n".encode(), f"+++ b/{relpath}\n".encode()]
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        first, last = group[0], group[-1]
        a0, a1, b0, b1 = first[1], last[2], first[3], last[4]
        out.append(f"@@ -{hunk_range(a0, a1)} +{hunk_range(b0, b1)} @@\n".encode())
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [marked(b" ", line) for line in old_lines[i1:i2]]
                continue
            out += [marked(b"-", line) for line in old_lines[i1:i2]]
            out += [marked(b"+", line) for line in new_lines[j1:j2]]
    return b"".join(out)


def hunk_range(start: int, end: int) -> str:
    length = end - start
    first = start + 1 if length else start
    return f"{first}" if length == 1 else f"{first},{length}"


def marked(prefix: bytes, line: bytes) -> bytes:
    if line.endswith(b"\n"):
        return prefix + line
    return prefix + line + b"\n\\ No newline at end of file\n"


def add_variant(patch: Patch, upstream: bytes, edited: bytes, relpath: str, versions: str, name: str):
    """Write `<folder>/<component>-<name>.diff`, check it round-trips with the engine, append its [[variant]]."""
    try:
        SpecifierSet(versions)
    except InvalidSpecifier as exc:
        raise RefusedError(f"bad version specifier {versions!r}: {exc}") from exc
    if not re.fullmatch(r"[A-Za-z0-9._+-]+", name):
        raise RefusedError(f"variant name {name!r}: use letters, digits, '.', '_', '+', '-'")
    if any(v.name == name for v in patch.variants):
        raise RefusedError(f"{patch.id} already has a variant {name!r}")
    if upstream == edited:
        raise RefusedError("the edited file is identical to the upstream file: nothing to diff")
    diff = unified_diff(upstream, edited, relpath)
    (fp,) = diffengine.parse_patch(diff)
    forward = diffengine.plan_file(fp, upstream)
    backward = diffengine.plan_file(fp, edited, reverse=True)
    if forward.new != edited or backward.new != upstream:
        raise RefusedError("the generated diff does not round-trip byte for byte (a bug: please report)")
    diff_path = patch.folder / f"{patch.component}-{name}.diff"
    if diff_path.exists():
        raise RefusedError(f"{diff_path} exists already")
    atomic_write(diff_path, diff, mode=0o644)
    meta = patch.folder / "patch.toml"
    text = meta.read_text(encoding="utf-8")
    sep = "" if text.endswith("\n") else "\n"
    entry = (f'{sep}\n[[variant]]\nname = "{name}"\nversions = "{versions}"\ndiff = "{diff_path.name}"\n'
             f"tested = []\n")
    atomic_write(meta, (text + entry).encode("utf-8"))
    load_patch(patch.folder, patch.component)  # the catalog still loads
    return diff_path
