"""Property tests of the diff engine: random files (repeated lines, LF / CRLF / mixed endings, a missing final
newline, a BOM) and random edits, diffed byte-faithfully with diffengine.unified_diff."""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from applier import diffengine
from applier.diffengine import BOM, FileState, HunkState

# A small alphabet forces repeated lines, which is what makes locating hunks hard.
TEXTS = ["a", "b", "c", "", "b c", "caf\u00e9"]
ENDING_STYLES = ("lf", "crlf", "mixed")


@dataclass(frozen=True)
class FileModel:
    bom: bool
    lines: tuple[tuple[str, bytes], ...]   # (text, ending) with ending b"\n" or b"\r\n"
    final_newline: bool

    def render(self) -> bytes:
        out = [text.encode() + ending for text, ending in self.lines]
        if out and not self.final_newline:
            text, ending = self.lines[-1]
            out[-1] = text.encode()
        return (BOM if self.bom else b"") + b"".join(out)


def endings_for(style: str) -> st.SearchStrategy[bytes]:
    if style == "lf":
        return st.just(b"\n")
    if style == "crlf":
        return st.just(b"\r\n")
    return st.sampled_from([b"\n", b"\r\n"])


@st.composite
def lines_of(draw, style: str, min_size: int = 0, max_size: int = 14):
    texts = draw(st.lists(st.sampled_from(TEXTS), min_size=min_size, max_size=max_size))
    return tuple((text, draw(endings_for(style))) for text in texts)


@st.composite
def edited_files(draw, styles=ENDING_STYLES):
    """(old bytes, new bytes): a random file and a random edit of it, both in one ending style."""
    style = draw(st.sampled_from(styles))
    bom = draw(st.booleans())
    old = FileModel(bom, draw(lines_of(style)), draw(st.booleans()))
    lines = list(old.lines)
    for _ in range(draw(st.integers(1, 4))):
        operation = draw(st.sampled_from(["insert", "delete", "replace", "re-end", "insert-run"]))
        at = draw(st.integers(0, len(lines)))
        if operation == "insert":
            lines.insert(at, (draw(st.sampled_from(TEXTS)), draw(endings_for(style))))
        elif operation == "insert-run":
            lines[at:at] = list(draw(lines_of(style, 1, 4)))
        elif lines and at < len(lines):
            if operation == "delete":
                del lines[at]
            elif operation == "replace":
                lines[at] = (draw(st.sampled_from(TEXTS)), draw(endings_for(style)))
            elif style == "mixed":  # re-end: only a mixed-ending file changes one line's ending
                text, ending = lines[at]
                lines[at] = (text, b"\r\n" if ending == b"\n" else b"\n")
    final_newline = old.final_newline if draw(st.integers(0, 3)) else not old.final_newline
    new = FileModel(bom, tuple(lines), final_newline)
    old_bytes, new_bytes = old.render(), new.render()
    assume(old_bytes != new_bytes)
    return old_bytes, new_bytes


def patch_of(old: bytes, new: bytes, context: int = 3) -> diffengine.FilePatch:
    file_patches = diffengine.parse_patch(diffengine.unified_diff(old, new, "pkg/mod.py", context=context))
    assert len(file_patches) == 1
    return file_patches[0]


def is_ambiguity(error: diffengine.HunkConflict) -> bool:
    """Repeated lines can make "applied" and "not applied" indistinguishable; the engine must then refuse."""
    return error.reason.startswith("ambiguous")


def plan_or_ambiguity(fp, data: bytes, **options) -> diffengine.FilePlan | None:
    try:
        return diffengine.plan_file(fp, data, **options)
    except diffengine.HunkConflict as error:
        assert is_ambiguity(error), str(error)
        event("refused as ambiguous")
        return None


@given(edited_files(), st.sampled_from([3, 2, 1]))
def test_apply_gives_the_new_file_and_revert_gives_the_old_byte_for_byte(pair, context):
    old, new = pair
    fp = patch_of(old, new, context)
    applied = plan_or_ambiguity(fp, old)
    if applied is None:
        return
    assert applied.new == new
    assert all(report.state is HunkState.NOT_APPLIED for report in applied.hunks)
    reverted = plan_or_ambiguity(diffengine.reverse_file_patch(fp), new)
    if reverted is not None:
        assert reverted.new == old


@given(edited_files(), st.sampled_from([3, 1]))
def test_applying_twice_never_changes_the_file_again(pair, context):
    old, new = pair
    fp = patch_of(old, new, context)
    once = plan_or_ambiguity(fp, old)
    if once is None:
        return
    twice = plan_or_ambiguity(fp, once.new)
    if twice is not None:
        assert twice.new == once.new
        assert not twice.changed
        assert all(report.state is HunkState.APPLIED for report in twice.hunks)
    # and reverting a file that is already reverted changes nothing either
    reverted_twice = plan_or_ambiguity(diffengine.reverse_file_patch(fp), old)
    if reverted_twice is not None:
        assert reverted_twice.new == old


@given(edited_files())
def test_classify_says_not_applied_before_and_applied_after(pair):
    old, new = pair
    fp = patch_of(old, new)
    for data, reverse, state in ((old, False, FileState.NOT_APPLIED), (new, False, FileState.APPLIED),
                                 (new, True, FileState.NOT_APPLIED), (old, True, FileState.APPLIED)):
        patch = diffengine.reverse_file_patch(fp) if reverse else fp
        reports = diffengine.scan_file(patch, data)
        if any(report.note.startswith("ambiguous") for report in reports):
            assert diffengine.classify_file(patch, data) is FileState.CONFLICT
            event("classified as ambiguous")
        else:
            assert diffengine.classify_file(patch, data) is state


@given(edited_files(styles=("lf", "crlf")), st.sampled_from(["crlf-transport", "lf-only"]))
def test_a_patch_whose_endings_were_converted_still_gives_the_files_own_endings(pair, conversion):
    old, new = pair
    # a file without any line ending has no ending of its own to follow
    assume(b"\n" in old and b"\n" in new)
    text = diffengine.unified_diff(old, new, "pkg/mod.py")
    lf_text = text.replace(b"\r\n", b"\n")
    converted = lf_text.replace(b"\n", b"\r\n") if conversion == "crlf-transport" else lf_text
    fp = diffengine.parse_patch(converted)[0]
    applied = plan_or_ambiguity(fp, old)
    if applied is not None:
        assert applied.new == new
    reverted = plan_or_ambiguity(diffengine.reverse_file_patch(fp), new)
    if reverted is not None:
        assert reverted.new == old


@st.composite
def edited_files_of_distinct_lines(draw):
    """Like edited_files, but every line is distinct, so a hunk's place is never in doubt."""
    style = draw(st.sampled_from(ENDING_STYLES))
    numbers = iter(range(1000))
    count = draw(st.integers(1, 30))
    # three fixed lines at each end keep every hunk's context complete: a hunk with short leading (trailing)
    # context is anchored at the start (end) of the file and rightly does not move
    head = [(f"head {n}", draw(endings_for(style))) for n in range(3)]
    tail = [(f"tail {n}", draw(endings_for(style))) for n in range(3)]
    old_lines = head + [(f"line {next(numbers)}", draw(endings_for(style))) for _ in range(count)] + tail
    lines = list(old_lines)
    for _ in range(draw(st.integers(1, 4))):
        operation = draw(st.sampled_from(["insert", "delete", "replace"]))
        at = draw(st.integers(3, len(lines) - 3))
        if operation == "insert" or at == len(lines) - 3:
            lines.insert(at, (f"new {next(numbers)}", draw(endings_for(style))))
        elif operation == "delete":
            del lines[at]
        else:
            lines[at] = (f"changed {next(numbers)}", draw(endings_for(style)))
    bom = draw(st.booleans())
    old = FileModel(bom, tuple(old_lines), draw(st.booleans()))
    new = FileModel(bom, tuple(lines), old.final_newline if draw(st.integers(0, 3)) else not old.final_newline)
    assume(old.render() != new.render())
    return old.render(), new.render()


@given(edited_files_of_distinct_lines(), st.integers(1, 8), st.integers(0, 5))
def test_hunks_are_found_at_an_offset_when_lines_were_added_above_and_below(pair, above, below):
    old, new = pair
    fp = patch_of(old, new)
    bom = BOM if old.startswith(BOM) else b""
    body_old, body_new = old.removeprefix(bom), new.removeprefix(bom)
    if not (body_old.endswith(b"\n") and body_new.endswith(b"\n")):
        below = 0  # lines after a last line without newline would change that line
    extra_above, extra_below = b"x\n" * above, b"y\n" * below
    shifted_old = bom + extra_above + body_old + extra_below
    shifted_new = bom + extra_above + body_new + extra_below
    plan = diffengine.plan_file(fp, shifted_old)
    assert plan.new == shifted_new
    assert [report.offset for report in plan.hunks] == [above] * len(fp.hunks)
    assert diffengine.plan_file(diffengine.reverse_file_patch(fp), shifted_new).new == shifted_old
    assert diffengine.classify_file(fp, shifted_new) is FileState.APPLIED


@given(edited_files())
def test_the_patch_round_trips_through_creation_and_deletion(pair):
    _, content = pair
    creation = diffengine.parse_patch(diffengine.unified_diff(None, content, "new.py"))[0]
    assert creation.is_new
    created = diffengine.plan_file(creation, None)
    assert created.new == content
    assert diffengine.plan_file(creation, content).new == content  # already there: no change
    deleted = diffengine.plan_file(diffengine.reverse_file_patch(creation), content)
    assert deleted.new is None


GIT = shutil.which("git")


@pytest.mark.skipif(GIT is None, reason="git is not installed")
@settings(max_examples=30)
@given(edited_files())
def test_git_apply_agrees_with_the_diff_writer(tmp_path_factory, pair):
    """unified_diff is the oracle of these properties: check it against git's own patch applier."""
    old, new = pair
    folder = tmp_path_factory.mktemp("git-apply")
    (folder / "pkg").mkdir()
    (folder / "pkg" / "mod.py").write_bytes(old)
    (folder / "change.diff").write_bytes(diffengine.unified_diff(old, new, "pkg/mod.py"))
    subprocess.run([GIT, "-c", "core.autocrlf=false", "apply", "--whitespace=nowarn", "change.diff"],
                   cwd=folder, check=True, capture_output=True)
    assert (folder / "pkg" / "mod.py").read_bytes() == new


# ------------------------------------------------------------------------- carriage returns, byte for byte

# Line contents drawn from few bytes (so lines repeat) that include a lone CR, also at a line's end: b"x\r" as a
# last line without newline, or b"x\r" + b"\r\n", are the bytes that a CR-blind writer or parser loses.
CR_CONTENTS = [b"", b"a", b"b", b"\r", b"a\r", b"\ra", b"a\rb", b"\xff\r", b" \t"]
CR_ENDINGS = [b"\n", b"\r\n"]


@st.composite
def cr_lines(draw, min_size: int = 0, max_size: int = 10):
    return [draw(st.sampled_from(CR_CONTENTS)) + draw(st.sampled_from(CR_ENDINGS))
            for _ in range(draw(st.integers(min_size, max_size)))]


def cr_render(lines: list[bytes], final_newline: bool) -> bytes:
    """The file's bytes; without a final newline the last line loses its LF (a CR before it stays: b"x\\r")."""
    if lines and not final_newline:
        lines = lines[:-1] + [lines[-1][:-1]]
    return b"".join(lines)


@st.composite
def cr_edited_files(draw, distinct: bool = False):
    """(a, b): random bytes made of lines with LF / CRLF / lone CR endings and maybe no final newline, and a random
    edit of them (lines inserted, deleted, replaced, re-ended, a CR added or removed at a line's end, the final
    newline toggled). With `distinct`, every line starts with its own number, so no hunk's place is in doubt."""
    numbers = iter(range(10_000))

    def numbered(line: bytes) -> bytes:
        return b"%d " % next(numbers) + line if distinct else line

    old = [numbered(line) for line in draw(cr_lines())]
    lines = list(old)
    for _ in range(draw(st.integers(1, 4))):
        operation = draw(st.sampled_from(["insert", "delete", "replace", "re-end", "toggle-cr"]))
        at = draw(st.integers(0, len(lines)))
        if operation == "insert":
            lines[at:at] = [numbered(line) for line in draw(cr_lines(1, 3))]
        elif at < len(lines):
            content = lines[at][:-2] if lines[at].endswith(b"\r\n") else lines[at][:-1]
            if operation == "delete":
                del lines[at]
            elif operation == "replace":
                lines[at] = numbered(draw(st.sampled_from(CR_CONTENTS)) + draw(st.sampled_from(CR_ENDINGS)))
            elif operation == "re-end":
                lines[at] = content + (b"\n" if lines[at].endswith(b"\r\n") else b"\r\n")
            else:  # a CR at the end of the content: b"x\r\n" <-> b"x\r\r\n", and b"x" <-> b"x\r" at the end
                ending = lines[at][len(content):]
                lines[at] = (content[:-1] if content.endswith(b"\r") else content + b"\r") + ending
    old_final, new_final = draw(st.booleans()), draw(st.booleans())
    a, b = cr_render(old, old_final), cr_render(lines, new_final)
    assume(a != b)
    return a, b


def assert_round_trip(a: bytes, b: bytes, *, ambiguity_allowed: bool) -> None:
    fp = patch_of(a, b)
    for data, reverse, want in ((a, False, b), (b, True, a)):
        try:
            plan = diffengine.plan_file(diffengine.reverse_file_patch(fp) if reverse else fp, data)
        except diffengine.HunkConflict as error:
            assert ambiguity_allowed and is_ambiguity(error), str(error)
            event("refused as ambiguous")
            continue
        assert plan.new == want


@given(cr_edited_files())
def test_every_carriage_return_survives_a_diff_and_its_reverse(pair):
    a, b = pair
    assert_round_trip(a, b, ambiguity_allowed=True)


@given(cr_edited_files(distinct=True))
def test_every_carriage_return_survives_when_no_hunk_is_in_doubt(pair):
    a, b = pair
    assert_round_trip(a, b, ambiguity_allowed=False)


@pytest.mark.parametrize("a, b", [
    (b"a\r", b"b\r"), (b"x\na\r", b"x\nb\r"), (b"a\r", b"a"), (b"a", b"a\r"), (b"\r", b""), (b"q\n\r", b"q\n"),
    (b"x\r\r\n", b"x\r\n"), (b"x\r\n", b"x\r\r\n"), (b"a\r\nb", b"a\r\nb\r"),
])
def test_a_carriage_return_at_the_end_of_a_line_is_kept(a, b):
    """The cases the fuzzing of issue 16 found (a last line without newline that ends in CR lost it)."""
    assert_round_trip(a, b, ambiguity_allowed=False)


@pytest.mark.skipif(GIT is None, reason="git is not installed")
@settings(max_examples=30)
@given(cr_edited_files())
def test_git_apply_agrees_with_the_diff_writer_on_carriage_returns(tmp_path_factory, pair):
    a, b = pair
    folder = tmp_path_factory.mktemp("git-apply-cr")
    (folder / "mod.py").write_bytes(a)
    (folder / "change.diff").write_bytes(diffengine.unified_diff(a, b, "mod.py"))
    subprocess.run([GIT, "-c", "core.autocrlf=false", "apply", "--whitespace=nowarn", "change.diff"],
                   cwd=folder, check=True, capture_output=True)
    assert (folder / "mod.py").read_bytes() == b
