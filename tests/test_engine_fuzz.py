"""Fuzzing the diff engine: whatever bytes arrive as a patch or as a file, the engine answers with a plan or an
ApplierError subclass (a documented exit code), never another exception (a traceback for the user).

Examples per test follow the hypothesis profile (tests/conftest.py): HYPOTHESIS_PROFILE=thorough for long runs."""
from __future__ import annotations

from pathlib import Path

from hypothesis import event, given
from hypothesis import strategies as st

from applier import diffengine
from applier.errors import ApplierError

CATALOG = Path(__file__).resolve().parents[1] / "patches"
CATALOG_DIFFS = sorted(path.read_bytes() for path in CATALOG.rglob("*.diff"))

# The pieces a unified diff is made of, and the odd ones that break parsers: numbers out of range, markers in the
# wrong place, quoted and escaping paths, binary and rename headers, CRLF, a BOM, bytes that are not UTF-8.
PATHS = [b"a/x.py", b"b/x.py", b"x.py", b"/dev/null", b'"a/q x.py"', b'"a/esc\\"x.py"', b"a/../up.py", b"a/",
         b"", b"a/pkg/mod.py", b"b/pkg/mod.py", b"a/caf\xc3\xa9.py", b"a/\xff.py", b"a/x.py\t2024-01-01 00:00:00"]
NUMBERS = [b"0", b"1", b"2", b"3", b"7", b"-1", b"99999999999999999999", b"", b"x", b"1,", b",1"]
CONTENT = [b"", b"a", b"b", b"line", b"\r", b"\xff\xfe", b"\xef\xbb\xbfbom", b"@@", b"---", b"+++", b"\\"]
ENDINGS = [b"\n", b"\r\n", b"\r", b""]


@st.composite
def diff_line(draw) -> bytes:
    kind = draw(st.sampled_from(["header", "hunk", "body", "body", "body", "marker", "git", "raw"]))
    if kind == "header":
        return draw(st.sampled_from([b"--- ", b"+++ ", b"---", b"+++"])) + draw(st.sampled_from(PATHS))
    if kind == "hunk":
        numbers = [draw(st.sampled_from(NUMBERS)) for _ in range(4)]
        section = draw(st.sampled_from([b"", b" def f():", b" @@"]))
        return (b"@@ -" + numbers[0] + b"," + numbers[1] + b" +" + numbers[2] + b"," + numbers[3] + b" @@"
                + section)
    if kind == "body":
        return draw(st.sampled_from([b" ", b"-", b"+"])) + draw(st.sampled_from(CONTENT))
    if kind == "marker":
        return draw(st.sampled_from([b"\\ No newline at end of file", b"\\", b"\\ anything"]))
    if kind == "git":
        return draw(st.sampled_from([
            b"diff --git a/x.py b/x.py", b"diff --git a/x.py b/y.py", b"index 1111111..2222222 100644",
            b"new file mode 100644", b"deleted file mode 100644", b"old mode 100644", b"new mode 100755",
            b"rename from x.py", b"rename to y.py", b"similarity index 90%", b"Binary files a/x and b/x differ",
            b"GIT binary patch", b"new file mode 120000", b"index 0000000..e69de29"]))
    return draw(st.binary(max_size=12))


@st.composite
def structured_diffs(draw) -> bytes:
    lines = draw(st.lists(diff_line(), max_size=24))
    return b"".join(line + draw(st.sampled_from(ENDINGS)) for line in lines)


@st.composite
def plausible_diffs(draw) -> bytes:
    """Well-formed diffs, mostly: file sections whose hunk headers count their lines (now and then off by one),
    with markers, CRLF and odd contents, so that many of them parse and reach the planner."""
    out = []
    paths = draw(st.permutations([b"x.py", b"pkg/mod.py", b"caf\xc3\xa9.py"]))
    for path in paths[:draw(st.integers(1, 3))]:
        source, target = draw(st.sampled_from([(b"a/" + path, b"b/" + path)] * 4 + [
            (b"/dev/null", b"b/" + path), (b"a/" + path, b"/dev/null")]))
        if draw(st.booleans()):
            out.append(b"diff --git a/" + path + b" b/" + path + b"\n")
        out.append(b"--- " + source + b"\n+++ " + target + b"\n")
        start = 1
        for _ in range(draw(st.integers(1, 3))):
            kinds = draw(st.lists(st.sampled_from(" -+"), min_size=1, max_size=8))
            if source == b"/dev/null":
                kinds = ["+" for _ in kinds]
            elif target == b"/dev/null":
                kinds = ["-" for _ in kinds]
            miscount = draw(st.sampled_from([0] * 18 + [1, -1]))
            before = sum(kind in " -" for kind in kinds) + miscount
            after = sum(kind in " +" for kind in kinds) + draw(st.sampled_from([0] * 19 + [1]))
            start += draw(st.integers(0, 5))
            out.append(b"@@ -%d,%d +%d,%d @@\n" % (0 if source == b"/dev/null" else start, before,
                                                  0 if target == b"/dev/null" else start, after))
            ending = draw(st.sampled_from([b"\n", b"\n", b"\r\n"]))
            for kind in kinds:
                out.append(kind.encode() + draw(st.sampled_from(CONTENT)) + ending)
                if draw(st.integers(0, 9)) == 0:
                    out.append(b"\\ No newline at end of file\n")
            start += max(before, 0)
    return b"".join(out)


@st.composite
def mutated_catalog_diffs(draw) -> bytes:
    """A real diff of the catalog with a few lines deleted, duplicated, swapped, cut or replaced."""
    lines = draw(st.sampled_from(CATALOG_DIFFS)).splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 4))):
        if not lines:
            break
        at = draw(st.integers(0, len(lines) - 1))
        operation = draw(st.sampled_from(["delete", "duplicate", "swap", "cut", "replace", "crlf"]))
        if operation == "delete":
            del lines[at]
        elif operation == "duplicate":
            lines.insert(at, lines[at])
        elif operation == "swap":
            other = draw(st.integers(0, len(lines) - 1))
            lines[at], lines[other] = lines[other], lines[at]
        elif operation == "cut":
            lines[at] = lines[at][:draw(st.integers(0, len(lines[at])))]
        elif operation == "replace":
            lines[at] = draw(diff_line()) + b"\n"
        else:
            lines[at] = lines[at].replace(b"\n", b"\r\n")
    return b"".join(lines)


files = st.one_of(st.none(), st.binary(max_size=64),
                  st.lists(st.sampled_from([b"a\n", b"b\n", b"line\r\n", b"\n", b"x", b"\r", b"\xef\xbb\xbf"]),
                           max_size=12).map(b"".join))


def exercise(patch: bytes, original: bytes | None, fuzz: int) -> None:
    """Every public entry point on one patch and one file: only ApplierError may come out."""
    try:
        file_patches = diffengine.parse_patch(patch)
    except ApplierError:
        event("patch refused")
        return
    event("patch parsed")
    for fp in file_patches:
        for patch in (fp, diffengine.reverse_file_patch(fp)):
            try:
                diffengine.scan_file(patch, original, fuzz=fuzz)
                diffengine.classify_file(patch, original, fuzz=fuzz)
                diffengine.plan_file(patch, original, fuzz=fuzz)
            except ApplierError:
                event("plan refused")
    try:
        diffengine.apply_patch_to_files(file_patches, {fp.path: original for fp in file_patches}, fuzz=fuzz)
    except ApplierError:
        pass


@given(st.binary(max_size=300), files, st.integers(0, 2))
def test_random_bytes_as_a_patch_raise_only_applier_errors(patch, original, fuzz):
    exercise(patch, original, fuzz)


@given(structured_diffs(), files, st.integers(0, 2))
def test_random_diffs_raise_only_applier_errors(patch, original, fuzz):
    exercise(patch, original, fuzz)


@given(plausible_diffs(), files, st.integers(0, 2))
def test_plausible_diffs_raise_only_applier_errors(patch, original, fuzz):
    exercise(patch, original, fuzz)


@given(mutated_catalog_diffs(), files, st.integers(0, 2))
def test_mutated_catalog_diffs_raise_only_applier_errors(patch, original, fuzz):
    exercise(patch, original, fuzz)


@given(st.sampled_from(CATALOG_DIFFS), st.binary(max_size=200), st.integers(0, 2))
def test_catalog_diffs_on_random_files_raise_only_applier_errors(patch, original, fuzz):
    exercise(patch, original, fuzz)


@given(files, files)
def test_the_diff_writer_accepts_any_bytes_and_its_diff_parses(old, new):
    text = diffengine.unified_diff(old, new, "pkg/mod.py")
    if text:
        (fp,) = diffengine.parse_patch(text)
        assert fp.path == "pkg/mod.py"
