"""The conflict report's near-match: it names the right place, and its cost stays near linear in the file's size
(issue 16: 16-20 s per variant for a ~140-line hunk against a file that already existed with other content)."""
from __future__ import annotations

import random
import time

import pytest

from applier.diffengine import parse_patch, plan_file, unified_diff
from applier.errors import HunkConflict

# A guard against the pathological case only (minutes before the fix), never a timing to meet: the goal is well
# under a second on an ordinary machine, and CI machines can be slow and busy.
PATHOLOGICAL_S = 10.0
WORDS = ["value", "result", "item", "model", "tensor", "device", "cache", "node", "prompt", "output", "input",
         "state", "key", "config", "memory", "stream", "batch", "index"]


def python_like_lines(seed: int, count: int) -> list[bytes]:
    """Distinct lines that look like Python source (indentation, names, calls): many shared characters between
    any two windows, which is what made a character-level similarity costly."""
    rng = random.Random(seed)
    lines = []
    for number in range(count):
        a, b, c = rng.choice(WORDS), rng.choice(WORDS), rng.choice(WORDS)
        shape = rng.randrange(6)
        indent = b"    " * rng.randrange(1, 4)
        if shape == 0:
            text = f"def {a}_{b}_{seed}_{number}(self, {c}):"
            indent = b"    "
        elif shape == 1:
            text = f"{a}_{number % 97} = self.{b}({c}, key=\"{a}\")"
        elif shape == 2:
            text = f"if {a} is not None and {b}.{c} > {number % 13}:"
        elif shape == 3:
            text = f"return {a}.{b}_{c}({number % 31})"
        elif shape == 4:
            text = f"# {a} {b} {c}: keep the {a} of the {b}"
        else:
            text = ""
            indent = b""
        lines.append(indent + text.encode() + b"\n")
    return lines


def file_of(lines: list[bytes], size: int) -> bytes:
    data = b"".join(lines)
    assert len(data) >= size
    return data[:data.rindex(b"\n", 0, size) + 1]


BIG_FILE = file_of(python_like_lines(1, 4000), 100_000)
HUNK_LINES = python_like_lines(2, 150)


def conflict_of(fp, original: bytes) -> tuple[HunkConflict, float]:
    start = time.perf_counter()
    with pytest.raises(HunkConflict) as caught:
        plan_file(fp, original)
    return caught.value, time.perf_counter() - start


def test_a_created_file_that_exists_with_other_content_is_reported_without_a_pathological_search():
    creation = parse_patch(unified_diff(None, b"".join(HUNK_LINES), "applier_oom_retry.py"))[0]
    error, seconds = conflict_of(creation, BIG_FILE)
    assert "already exists" in error.reason
    assert seconds < PATHOLOGICAL_S, f"the conflict report took {seconds:.1f} s for a 100 kB file"


def test_a_hunk_whose_lines_are_gone_is_reported_without_a_pathological_search():
    # a 150-line hunk against a 100 kB file it does not fit, expected in the middle of the file
    block = python_like_lines(3, 150)
    changed = block[:75] + [b"    patched = True\n"] + block[76:]
    text = unified_diff(b"".join(block), b"".join(changed), "pkg/mod.py", context=75)
    assert b"@@ -1,150 +1,150 @@" in text
    fp = parse_patch(text.replace(b"@@ -1,150 +1,150 @@", b"@@ -1200,150 +1200,150 @@"))[0]
    error, seconds = conflict_of(fp, BIG_FILE)
    assert "no fuzz" in error.reason
    assert seconds < PATHOLOGICAL_S, f"the conflict report took {seconds:.1f} s for a 100 kB file"


def test_the_near_match_is_found_far_from_the_expected_place_in_a_big_file():
    block = python_like_lines(4, 150)
    edited = list(block)
    edited[70] = b"    something_else = 'edited by the user'\n"
    at = 1500
    lines = BIG_FILE.splitlines(keepends=True)
    original = b"".join(lines[:at] + edited + lines[at:])
    changed = list(block)
    changed[75] = b"    patched = True\n"
    fp = parse_patch(unified_diff(b"".join(block), b"".join(changed), "pkg/mod.py", context=75))[0]
    error, _ = conflict_of(fp, original)
    assert error.near_line == at + 1
    assert error.near_text[70] == "    something_else = 'edited by the user'"


def test_the_near_match_names_the_edited_place_in_a_small_file():
    twenty = b"".join(b"line %d\n" % n for n in range(1, 21))
    fp = parse_patch(b"--- a/m\n+++ b/m\n@@ -7,7 +7,7 @@\n line 7\n line 8\n line 9\n-line 10\n+line ten\n"
                     b" line 11\n line 12\n line 13\n")[0]
    moved = b"".join(b"top %d\n" % n for n in range(30)) + twenty.replace(b"line 10\n", b"line 10 # edited\n")
    error, _ = conflict_of(fp, moved)
    assert error.near_line == 30 + 7
    assert error.near_text[3] == "line 10 # edited"


def test_a_reindented_block_is_still_found_as_the_near_match():
    block = [b"def f():\n", b"    a = 1\n", b"    b = 2\n", b"    return a + b\n"]
    fp = parse_patch(unified_diff(b"".join(block), b"".join(block[:3] + [b"    return a * b\n"]), "m"))[0]
    original = b"x = 0\n" * 10 + b"class K:\n" + b"".join(b"    " + line for line in block) + b"y = 1\n" * 10
    error, _ = conflict_of(fp, original)
    assert error.near_line == 12
    assert error.near_text[0] == "    def f():"


def test_a_file_with_nothing_in_common_reports_no_near_match_or_a_window_near_the_expected_place():
    fp = parse_patch(b"--- a/m\n+++ b/m\n@@ -3,3 +3,3 @@\n alpha\n-beta\n+BETA\n gamma\n")[0]
    error, _ = conflict_of(fp, b"".join(b"%d\n" % n for n in range(1000)))
    assert error.near_line is None or abs(error.near_line - 3) <= 10
