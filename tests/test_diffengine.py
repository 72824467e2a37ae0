"""The diff engine, case by case: parsing, line endings, BOM, final newlines, locating hunks, states, errors."""
from __future__ import annotations

import pytest

from applier import diffengine
from applier.diffengine import (BOM, FileState, HunkState, classify_file, parse_patch, plan_file, reverse_file_patch,
                                unified_diff)
from applier.errors import EXIT_REFUSED, DiffParseError, HunkConflict

TWENTY = b"".join(b"line %d\n" % n for n in range(1, 21))


def one(patch: bytes) -> diffengine.FilePatch:
    file_patches = parse_patch(patch)
    assert len(file_patches) == 1
    return file_patches[0]


def crlf(data: bytes) -> bytes:
    return data.replace(b"\n", b"\r\n")


LINE_10_PATCH = b"""\
diff --git a/pkg/mod.py b/pkg/mod.py
index 1111111..2222222 100644
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -7,7 +7,8 @@ def section():
 line 7
 line 8
 line 9
-line 10
+line ten
+line ten and a half
 line 11
 line 12
 line 13
"""
LINE_10_RESULT = TWENTY.replace(b"line 10\n", b"line ten\nline ten and a half\n")


# --------------------------------------------------------------------------------------------------- parsing


def test_git_diff_parses_into_a_file_patch_without_the_a_b_prefixes():
    fp = one(LINE_10_PATCH)
    assert fp.path == "pkg/mod.py"
    assert not fp.is_new and not fp.is_deleted
    (hunk,) = fp.hunks
    assert (hunk.index, hunk.source_start, hunk.source_length, hunk.target_start, hunk.target_length) == \
        (1, 7, 7, 7, 8)
    assert hunk.header == "@@ -7,7 +7,8 @@ def section():"
    assert hunk.before == ["line 7", "line 8", "line 9", "line 10", "line 11", "line 12", "line 13"]
    assert hunk.after[3:5] == ["line ten", "line ten and a half"]
    assert ("-", "line 10") in hunk.lines


def test_plain_diff_with_timestamps_strips_a_b_only_when_both_sides_use_them():
    prefixed = b"--- a/x.py\t2024-01-01 00:00:00\n+++ b/x.py\t2024-01-02 00:00:00\n@@ -1 +1 @@\n-old\n+new\n"
    assert one(prefixed).path == "x.py"
    bare = b"--- comfy/x.py\n+++ comfy/x.py\n@@ -1 +1 @@\n-old\n+new\n"
    assert one(bare).path == "comfy/x.py"


def test_several_files_in_one_diff_come_back_in_order():
    patch = (b"--- a/one.py\n+++ b/one.py\n@@ -1 +1 @@\n-1\n+one\n"
             b"--- a/two/two.py\n+++ b/two/two.py\n@@ -1 +1 @@\n-2\n+two\n")
    assert [fp.path for fp in parse_patch(patch)] == ["one.py", "two/two.py"]


def test_dev_null_marks_creation_and_deletion():
    created = one(b"--- /dev/null\n+++ b/new.py\n@@ -0,0 +1,2 @@\n+a\n+b\n")
    assert created.path == "new.py" and created.is_new and not created.is_deleted
    deleted = one(b"--- a/old.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n")
    assert deleted.path == "old.py" and deleted.is_deleted and not deleted.is_new


@pytest.mark.parametrize("patch, words", [
    (b"diff --git a/img.png b/img.png\nindex 1..2 100644\nBinary files a/img.png and b/img.png differ\n",
     "binary"),
    (b"diff --git a/img.png b/img.png\nindex 1..2 100644\nGIT binary patch\nliteral 5\nMcmZ?wbNtT$00\n\n",
     "binary"),
    (b"diff --git a/old.py b/new.py\nsimilarity index 100%\nrename from old.py\nrename to new.py\n",
     "rename"),
    (b"diff --git a/a.py b/b.py\nsimilarity index 90%\ncopy from a.py\ncopy to b.py\n", "cop"),
    (b"diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n", "mode"),
    (b"--- x.py.orig\n+++ x.py\n@@ -1 +1 @@\n-a\n+b\n", "rename"),
    (b"", "empty"),
    (b"  \n\n", "empty"),
    (b"this is not a diff at all\njust text\n", "no file"),
    (b"--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n-a\n+b\n", "not a valid unified diff"),
])
def test_unsupported_or_garbled_patches_are_refused_with_a_clear_message(patch, words):
    with pytest.raises(DiffParseError) as caught:
        parse_patch(patch)
    assert words in str(caught.value).lower()
    assert caught.value.exit_code == EXIT_REFUSED


def test_a_crlf_patch_parses_to_the_same_lines_as_its_lf_twin():
    lf, converted = one(LINE_10_PATCH), one(crlf(LINE_10_PATCH))
    assert converted.path == lf.path
    assert converted.hunks[0].lines == lf.hunks[0].lines
    assert converted.hunks[0].header == lf.hunks[0].header


def test_no_newline_markers_are_attached_to_the_right_side():
    fp = one(b"--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n")
    assert fp.hunks[0].source_no_newline and not fp.hunks[0].target_no_newline
    fp = one(b"--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n a\n-b\n+b\n\\ No newline at end of file\n")
    assert fp.hunks[0].target_no_newline and not fp.hunks[0].source_no_newline
    fp = one(b"--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-a\n+A\n b\n\\ No newline at end of file\n")
    assert fp.hunks[0].target_no_newline and fp.hunks[0].source_no_newline


# ---------------------------------------------------------------------------------------------- applying


def test_a_hunk_applies_at_its_header_line_and_is_reported_there():
    plan = plan_file(one(LINE_10_PATCH), TWENTY)
    assert plan.new == LINE_10_RESULT
    assert plan.changed
    (report,) = plan.hunks
    assert (report.path, report.index, report.state, report.line, report.offset, report.fuzz) == \
        ("pkg/mod.py", 1, HunkState.NOT_APPLIED, 7, 0, 0)


def test_crlf_file_with_lf_patch_keeps_crlf_on_every_line_including_the_new_ones():
    assert plan_file(one(LINE_10_PATCH), crlf(TWENTY)).new == crlf(LINE_10_RESULT)


def test_crlf_patch_on_lf_file_writes_lf():
    assert plan_file(one(crlf(LINE_10_PATCH)), TWENTY).new == LINE_10_RESULT


def test_crlf_patch_on_crlf_file_writes_crlf():
    assert plan_file(one(crlf(LINE_10_PATCH)), crlf(TWENTY)).new == crlf(LINE_10_RESULT)


def test_mixed_endings_survive_and_an_inserted_line_takes_its_neighbours_ending():
    original = b"one\r\ntwo\nthree\r\nfour\nfive\r\n"
    patch = b"--- a/m\n+++ b/m\n@@ -2,3 +2,4 @@\n two\n-three\n+THREE\n+three and a half\n four\n"
    # an LF patch on a file whose lines end otherwise: the replacement takes the replaced line's CRLF
    assert plan_file(one(patch), original).new == b"one\r\ntwo\nTHREE\r\nthree and a half\r\nfour\nfive\r\n"
    insertion = b"--- a/m\n+++ b/m\n@@ -2,2 +2,3 @@\n two\n+two and a half\n three\n"
    assert plan_file(one(insertion), original).new == b"one\r\ntwo\ntwo and a half\nthree\r\nfour\nfive\r\n"


def test_a_faithful_diff_of_a_mixed_file_reproduces_every_ending_even_ending_only_changes():
    old = b"a\r\nb\nc\r\nd\n"
    new = b"a\r\nb\r\nc\r\nX\r\nd\n"
    fp = one(unified_diff(old, new, "m"))
    assert plan_file(fp, old).new == new
    assert plan_file(fp, new).new == new
    assert plan_file(reverse_file_patch(fp), new).new == old
    assert classify_file(fp, old) is FileState.NOT_APPLIED
    assert classify_file(fp, new) is FileState.APPLIED


def test_a_bom_survives_a_patch_that_does_not_mention_it():
    original = BOM + b"first\nsecond\nthird\n"
    patch = b"--- a/m\n+++ b/m\n@@ -1,3 +1,3 @@\n-first\n+FIRST\n second\n third\n"
    assert plan_file(one(patch), original).new == BOM + b"FIRST\nsecond\nthird\n"


def test_a_bom_in_the_patch_matches_the_file_and_is_written_once():
    original = BOM + b"first\nsecond\n"
    patched = BOM + b"FIRST\nsecond\n"
    fp = one(unified_diff(original, patched, "m"))
    assert fp.hunks[0].source_bom and fp.hunks[0].target_bom
    assert plan_file(fp, original).new == patched
    assert plan_file(reverse_file_patch(fp), patched).new == original


def test_a_file_without_final_newline_keeps_it_missing_when_the_hunk_is_elsewhere():
    original = TWENTY + b"last"
    assert plan_file(one(LINE_10_PATCH), original).new == LINE_10_RESULT + b"last"


def test_a_patch_that_adds_the_final_newline():
    old, new = b"a\nb\nc", b"a\nb\nc\n"
    fp = one(unified_diff(old, new, "m"))
    assert fp.hunks[0].source_no_newline
    assert plan_file(fp, old).new == new
    assert plan_file(fp, new).new == new
    assert plan_file(reverse_file_patch(fp), new).new == old
    assert plan_file(fp, crlf(old)).new == crlf(new)  # the new ending follows the file


def test_a_patch_that_removes_the_final_newline():
    old, new = b"a\nb\nc\n", b"a\nb\nc"
    fp = one(unified_diff(old, new, "m"))
    assert fp.hunks[0].target_no_newline
    assert plan_file(fp, old).new == new
    assert classify_file(fp, new) is FileState.APPLIED
    assert plan_file(reverse_file_patch(fp), new).new == old


def test_a_last_line_without_newline_does_not_match_a_hunk_that_expects_one():
    fp = one(b"--- a/m\n+++ b/m\n@@ -1,2 +1,2 @@\n-a\n+A\n b\n")
    with pytest.raises(HunkConflict):
        plan_file(fp, b"a\nb")


def test_a_lone_carriage_return_is_content_not_a_line_break():
    old = b"x = '\r'\ny\n"
    fp = one(unified_diff(old, b"x = '\r'\nY\n", "m"))
    assert plan_file(fp, old).new == b"x = '\r'\nY\n"


def test_bytes_that_are_not_utf8_round_trip():
    old = b"caf\xe9\nna\xefve\n\xff\xfe\n"
    new = b"caf\xe9\nNA\xcfVE\n\xff\xfe\n"
    fp = one(unified_diff(old, new, "latin1.txt"))
    assert plan_file(fp, old).new == new
    assert plan_file(reverse_file_patch(fp), new).new == old


# ------------------------------------------------------------------------------------------ locating hunks


def test_lines_inserted_above_give_an_offset():
    shifted = b"new 1\nnew 2\nnew 3\n" + TWENTY
    plan = plan_file(one(LINE_10_PATCH), shifted)
    assert plan.new == b"new 1\nnew 2\nnew 3\n" + LINE_10_RESULT
    assert (plan.hunks[0].line, plan.hunks[0].offset) == (10, 3)
    assert "offset +3" in plan.hunks[0].note


def test_the_offset_of_one_hunk_carries_to_the_next():
    new = TWENTY.replace(b"line 5\n", b"line five\n").replace(b"line 15\n", b"line fifteen\n")
    fp = one(unified_diff(TWENTY, new, "m"))
    assert len(fp.hunks) == 2
    shifted = b"x\n" * 4 + TWENTY
    plan = plan_file(fp, shifted)
    assert plan.new == b"x\n" * 4 + new
    assert [report.offset for report in plan.hunks] == [4, 4]


def test_several_hunks_that_change_the_length_apply_in_order():
    new = (TWENTY.replace(b"line 2\n", b"")
           .replace(b"line 10\n", b"line 10\nextra a\nextra b\n")
           .replace(b"line 18\n", b"line eighteen\n"))
    fp = one(unified_diff(TWENTY, new, "m"))
    assert len(fp.hunks) == 3
    plan = plan_file(fp, TWENTY)
    assert plan.new == new
    assert [report.offset for report in plan.hunks] == [0, 0, 0]
    assert classify_file(fp, new) is FileState.APPLIED


def test_of_two_equally_distant_matches_the_earlier_wins():
    old = b"a\nb\nhere\nb\nc\n"
    fp = one(b"--- a/m\n+++ b/m\n@@ -3 +3 @@\n-b\n+B\n")  # no context: expects b on line 3, finds 2 and 4
    plan = plan_file(fp, old)
    assert plan.new == b"a\nB\nhere\nb\nc\n"
    assert plan.hunks[0].offset == -1


def test_a_hunk_at_the_start_of_the_file_stays_anchored_there():
    # less leading than trailing context: the hunk belongs at line 1 and must not move to a later copy
    fp = one(b"--- a/m\n+++ b/m\n@@ -1,3 +1,4 @@\n+header\n a\n b\n c\n")
    assert plan_file(fp, b"a\nb\nc\nz\n").new == b"header\na\nb\nc\nz\n"
    with pytest.raises(HunkConflict):
        plan_file(fp, b"z\na\nb\nc\n")


def test_a_hunk_at_the_end_of_the_file_stays_anchored_there():
    fp = one(b"--- a/m\n+++ b/m\n@@ -1,3 +1,4 @@\n a\n b\n c\n+footer\n")
    assert plan_file(fp, b"z\na\nb\nc\n").new == b"z\na\nb\nc\nfooter\n"
    with pytest.raises(HunkConflict):
        plan_file(fp, b"a\nb\nc\nz\n")


def test_a_zero_context_insertion_goes_where_the_header_says():
    fp = one(b"--- a/m\n+++ b/m\n@@ -2,0 +3 @@\n+inserted\n")
    plan = plan_file(fp, b"a\nb\nc\n")
    assert plan.new == b"a\nb\ninserted\nc\n"
    assert plan_file(fp, plan.new).new == plan.new


def test_fuzz_is_used_only_when_allowed_and_is_reported():
    fp = one(LINE_10_PATCH)
    edited = TWENTY.replace(b"line 7\n", b"line seven\n")  # the first context line no longer matches
    with pytest.raises(HunkConflict) as caught:
        plan_file(fp, edited)
    assert "no fuzz" in caught.value.reason
    plan = plan_file(fp, edited, fuzz=1)
    assert plan.new == LINE_10_RESULT.replace(b"line 7\n", b"line seven\n")
    assert plan.hunks[0].fuzz == 1
    assert plan.hunks[0].offset == 0
    assert classify_file(fp, plan.new, fuzz=1) is FileState.APPLIED


def test_fuzz_does_not_help_when_a_changed_line_differs():
    edited = TWENTY.replace(b"line 10\n", b"line 10 edited by the user\n")
    with pytest.raises(HunkConflict):
        plan_file(one(LINE_10_PATCH), edited, fuzz=2)


def test_negative_fuzz_is_a_programming_error():
    with pytest.raises(ValueError):
        plan_file(one(LINE_10_PATCH), TWENTY, fuzz=-1)


# ------------------------------------------------------------------------------------------------- states


def test_an_already_applied_patch_is_reported_and_not_applied_again():
    plan = plan_file(one(LINE_10_PATCH), LINE_10_RESULT)
    assert plan.new == plan.old == LINE_10_RESULT
    assert not plan.changed
    assert [report.state for report in plan.hunks] == [HunkState.APPLIED]
    assert "already applied" in plan.hunks[0].note
    assert classify_file(one(LINE_10_PATCH), LINE_10_RESULT) is FileState.APPLIED
    assert classify_file(one(LINE_10_PATCH), TWENTY) is FileState.NOT_APPLIED


def test_reverse_undoes_the_patch_and_a_reverted_file_is_left_alone():
    fp = one(LINE_10_PATCH)
    assert plan_file(reverse_file_patch(fp), LINE_10_RESULT).new == TWENTY
    unchanged = plan_file(reverse_file_patch(fp), TWENTY)
    assert unchanged.new == TWENTY and not unchanged.changed
    assert [report.state for report in unchanged.hunks] == [HunkState.APPLIED]


def test_a_partially_applied_file_gets_the_missing_hunk_and_reports_both():
    new = TWENTY.replace(b"line 3\n", b"line three\n").replace(b"line 17\n", b"line seventeen\n")
    fp = one(unified_diff(TWENTY, new, "m"))
    half = TWENTY.replace(b"line 3\n", b"line three\n")
    assert classify_file(fp, half) is FileState.PARTIAL
    plan = plan_file(fp, half)
    assert plan.new == new
    assert [report.state for report in plan.hunks] == [HunkState.APPLIED, HunkState.NOT_APPLIED]


def test_one_conflicting_hunk_makes_the_file_a_conflict():
    new = TWENTY.replace(b"line 3\n", b"line three\n").replace(b"line 17\n", b"line seventeen\n")
    fp = one(unified_diff(TWENTY, new, "m"))
    damaged = TWENTY.replace(b"line 17\n", b"something else\n")
    assert classify_file(fp, damaged) is FileState.CONFLICT
    states = [report.state for report in diffengine.scan_file(fp, damaged)]
    assert states == [HunkState.NOT_APPLIED, HunkState.CONFLICT]
    with pytest.raises(HunkConflict) as caught:
        plan_file(fp, damaged)
    assert caught.value.hunk_index == 2


def test_a_conflict_names_the_file_the_hunk_the_expected_lines_and_the_nearest_match():
    damaged = TWENTY.replace(b"line 10\n", b"line 10 # edited\n")
    with pytest.raises(HunkConflict) as caught:
        plan_file(one(LINE_10_PATCH), damaged)
    error = caught.value
    assert error.path == "pkg/mod.py"
    assert error.hunk_index == 1
    assert error.header == "@@ -7,7 +7,8 @@ def section():"
    assert error.expected == ["line 7", "line 8", "line 9", "line 10", "line 11", "line 12", "line 13"]
    assert error.near_line == 7
    assert error.near_text[3] == "line 10 # edited"
    assert error.reason
    message = str(error)
    assert "pkg/mod.py" in message and "hunk #1" in message and "line 7" in message
    assert error.exit_code == EXIT_REFUSED


def test_hunks_must_apply_in_order():
    patch = (b"--- a/m\n+++ b/m\n"
             b"@@ -5,3 +5,3 @@\n line 5\n-line 6\n+line six\n line 7\n"
             b"@@ -15,3 +15,3 @@\n line 2\n-line 3\n+line three\n line 4\n")
    with pytest.raises(HunkConflict) as caught:
        plan_file(one(patch), TWENTY)
    assert caught.value.hunk_index == 2
    assert "in order" in caught.value.reason


def test_identical_old_and_new_lines_in_the_same_place_are_refused_as_ambiguous():
    # five "a" could be the original (remove the first) or the result of removing one of six
    fp = one(b"--- a/m\n+++ b/m\n@@ -1,4 +1,3 @@\n-a\n a\n a\n a\n")
    with pytest.raises(HunkConflict) as caught:
        plan_file(fp, b"a\na\na\na\na\n")
    assert caught.value.reason.startswith("ambiguous")
    assert classify_file(fp, b"a\na\na\na\na\n") is FileState.CONFLICT


def test_patching_a_missing_file_is_a_conflict():
    with pytest.raises(HunkConflict) as caught:
        plan_file(one(LINE_10_PATCH), None)
    assert "does not exist" in caught.value.reason
    assert classify_file(one(LINE_10_PATCH), None) is FileState.CONFLICT


# ----------------------------------------------------------------------------------- creation and deletion


CREATION = b"diff --git a/new.py b/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/new.py\n@@ -0,0 +1,2 @@\n+a\n+b\n"


def test_creation_writes_the_new_file():
    plan = plan_file(one(CREATION), None)
    assert (plan.old, plan.new) == (None, b"a\nb\n")
    assert classify_file(one(CREATION), None) is FileState.NOT_APPLIED


def test_creation_of_a_file_that_already_has_that_content_is_applied():
    plan = plan_file(one(CREATION), b"a\nb\n")
    assert plan.new == b"a\nb\n" and not plan.changed
    assert plan.hunks[0].state is HunkState.APPLIED
    assert classify_file(one(CREATION), b"a\nb\n") is FileState.APPLIED


def test_creation_over_a_different_file_is_refused():
    with pytest.raises(HunkConflict) as caught:
        plan_file(one(CREATION), b"something else\n")
    assert "already exists" in caught.value.reason
    assert classify_file(one(CREATION), b"something else\n") is FileState.CONFLICT


def test_reversing_a_creation_deletes_the_file():
    plan = plan_file(reverse_file_patch(one(CREATION)), b"a\nb\n")
    assert plan.new is None and plan.changed


def test_a_new_file_keeps_the_patch_endings_and_missing_final_newline():
    fp = one(unified_diff(None, b"a\r\nb", "new.txt"))
    assert plan_file(fp, None).new == b"a\r\nb"


def test_a_new_empty_file_from_a_git_diff_without_hunks():
    fp = one(b"diff --git a/empty.py b/empty.py\nnew file mode 100644\nindex 0000000..e69de29\n")
    assert fp.is_new and fp.hunks == ()
    assert plan_file(fp, None).new == b""
    assert classify_file(fp, b"") is FileState.APPLIED


DELETION = b"--- a/old.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n"


def test_deletion_needs_the_whole_content_to_match():
    plan = plan_file(one(DELETION), b"a\nb\n")
    assert (plan.old, plan.new) == (b"a\nb\n", None)
    with pytest.raises(HunkConflict) as caught:
        plan_file(one(DELETION), b"a\nb\nc\n")
    assert "differs" in caught.value.reason


def test_deleting_an_absent_file_is_already_applied():
    plan = plan_file(one(DELETION), None)
    assert plan.new is None and not plan.changed
    assert classify_file(one(DELETION), None) is FileState.APPLIED


def test_reversing_a_deletion_recreates_the_file():
    assert plan_file(reverse_file_patch(one(DELETION)), None).new == b"a\nb\n"


# -------------------------------------------------------------------------------------- several files


def test_apply_patch_to_files_plans_every_file_and_treats_missing_ones_as_absent():
    patches = parse_patch(LINE_10_PATCH + CREATION + DELETION)
    files = {"pkg/mod.py": TWENTY, "old.py": b"a\nb\n"}
    plans = diffengine.apply_patch_to_files(patches, files)
    assert [(plan.path, plan.new) for plan in plans] == [
        ("pkg/mod.py", LINE_10_RESULT), ("new.py", b"a\nb\n"), ("old.py", None)]
    assert files == {"pkg/mod.py": TWENTY, "old.py": b"a\nb\n"}  # the input is not modified
    after = {plan.path: plan.new for plan in plans}
    back = diffengine.apply_patch_to_files(diffengine.reverse_patches(patches), after)[::-1]  # last undone first
    assert [(plan.path, plan.new) for plan in back] == [
        ("pkg/mod.py", TWENTY), ("new.py", None), ("old.py", b"a\nb\n")]


def test_apply_patch_to_files_stops_at_the_first_conflict():
    with pytest.raises(HunkConflict):
        diffengine.apply_patch_to_files(parse_patch(LINE_10_PATCH + CREATION), {"pkg/mod.py": b"other\n"})


# ---------------------------------------------------------------------------------------- the diff writer


def test_unified_diff_marks_a_missing_final_newline_and_uses_dev_null():
    assert unified_diff(b"a\n", b"a\n", "m") == b""
    text = unified_diff(b"a\nb", b"a\nc", "m")
    assert text.endswith(b"-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n")
    created = unified_diff(None, b"x\n", "n.py")
    assert b"--- /dev/null\n+++ b/n.py\n@@ -0,0 +1 @@\n+x\n" in created
    deleted = unified_diff(b"x\n", None, "n.py")
    assert b"--- a/n.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n" in deleted


# ---------------------------------------------------------------------------- one section per file


@pytest.mark.parametrize("second", [
    b"--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -5 +5 @@\n-5\n+five\n",                      # the same spelling
    b"diff --git a/pkg/mod.py b/pkg/mod.py\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -5 +5 @@\n-5\n+five\n",
    b"--- pkg//mod.py\n+++ pkg//mod.py\n@@ -5 +5 @@\n-5\n+five\n",                        # another spelling
    b"--- a/pkg/mod.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-one\n",                            # then deleted
])
def test_two_sections_for_the_same_file_are_refused_naming_the_file(second):
    # Applied one after the other, the second section would be planned against the original bytes and its result
    # would silently replace the first one's: refuse instead.
    patch = (b"--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1 +1 @@\n-1\n+one\n"
             b"--- a/other.py\n+++ b/other.py\n@@ -1 +1 @@\n-x\n+y\n" + second)
    with pytest.raises(DiffParseError) as caught:
        parse_patch(patch)
    message = str(caught.value)
    assert "pkg/mod.py" in message
    assert "two sections" in message and "1" in message and "3" in message
    assert caught.value.exit_code == EXIT_REFUSED


def test_the_catalog_has_one_section_per_file_in_every_diff():
    from pathlib import Path
    diffs = sorted((Path(__file__).resolve().parents[1] / "patches").rglob("*.diff"))
    assert diffs
    for diff in diffs:
        paths = [fp.path for fp in parse_patch(diff.read_bytes())]
        assert len(paths) == len(set(paths)), diff.name
