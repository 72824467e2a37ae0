r"""The diff engine: pure functions, bytes in, bytes out, no file system.

CONTRACT (implemented by the diff-engine work; the shell depends on exactly this API):

    parse_patch(data: bytes) -> list[FilePatch]
        Parse a unified diff (git or plain style) with `unidiff`. Read as bytes: the patch itself may carry CRLF.
        Paths: strip a leading "a/" / "b/" (git style); "/dev/null" marks creation/deletion; `.` components and
        repeated slashes are dropped (a/./x.py is a/x.py; `..` is kept for the path checks to refuse).
        Raises DiffParseError for: empty/garbled text, binary diffs ("Binary files ... differ", "GIT binary patch"),
        renames/copies/mode-only changes we do not support, two sections for the same file (the message names
        the file and both sections), a patch over MAX_PATCH_BYTES or with more than MAX_HUNKS hunks (parse.py).

    plan_file(fp: FilePatch, original: bytes | None, *, fuzz: int = 0) -> FilePlan
        original is None when the file does not exist. Returns the new bytes (None = delete the file)
        and one HunkReport per hunk. Never raises for "already applied": that is a state, not an error.
        Raises HunkConflict (applier.errors) naming the file, the hunk, the expected lines, the best near-match.

    classify_file(fp: FilePatch, original: bytes | None) -> FileState
        APPLIED when every hunk's post-image is present (and the pre-image is not where it would apply),
        NOT_APPLIED when every hunk's pre-image is present, PARTIAL when some hunks are applied and the others
        apply, CONFLICT otherwise. Used by status and by apply ("already applied" is reported, never re-applied).

    Also public (all pure):
    scan_file(fp, original, *, fuzz=0) -> tuple[HunkReport, ...]                   per-hunk states, never raises
    reverse_file_patch(fp) -> FilePatch                                             the undoing patch
    reverse_patches(patches) -> list[FilePatch]                                     each undone, the last one first
    apply_patch_to_files(patches, files, *, fuzz=0) -> list[FilePlan]               in order, one plan per patch
    unified_diff(old: bytes | None, new: bytes | None, path, *, context=3) -> bytes  a byte-faithful git-style diff
    classify_file also takes fuzz= (a file applied with fuzz is recognised with fuzz).

    Reversal is a transform of the patch, not a flag (patch-package's reversePatch): to undo a file, or to ask
    whether it holds its original again, plan or classify reverse_file_patch(fp) like any other patch; undoing
    several is apply_patch_to_files(reverse_patches(patches), files), whose plans come last patch first.

RULES (what "present", "found" and "ending" mean here):

* Line model. A file is split on b"\n" only; every line keeps its own ending: b"\n", b"\r\n", or b"" for a final
  line without newline. A lone b"\r" is content. A UTF-8 BOM is held apart from the lines and written back as it
  was (a patch does not add or remove a BOM of an existing file). Text is never decoded for matching: the patch is
  decoded as UTF-8 with surrogateescape, so its lines encode back to the exact bytes. In a patch, a line marked
  "\ No newline at end of file" is its bytes plus the diff's own LF, so a CR before that LF is content (a file
  that ends in b"x\r"), except in a CRLF-transported patch.
* Matching. A hunk line matches a file line when both are equal after dropping the ending and one trailing b"\r",
  so an LF patch matches a CRLF file and the reverse. The final newline is strict: an image whose last line is
  marked "\ No newline at end of file" only matches at the end of a file whose last line has no ending, and an
  image without the marker never matches a last line without ending. A match is "exact" when, in addition, every
  line the patch carries equals the file's byte for byte, its ending and a trailing b"\r" of its content
  included (a CRLF-transported patch, recognised by its CRLF "@@" headers, carries no ending information).
* Locating a hunk. The expected line is the header's line plus the running offset of the hunks before it. Each
  image (pre and post) is searched at the expected line, then outward (smallest distance first; on equal distance
  the earlier line), never before the end of the previous hunk, so hunks apply in order without overlap. As in GNU
  patch, a hunk with less leading than trailing context that starts at line 1 is anchored to the start of the file,
  and one with less trailing than leading context (or a "No newline" marker) to its end. Only when fuzz > 0 is
  allowed and nothing was found: drop up to `fuzz` context lines at both ends (GNU's rule) and search again; the
  fuzz used is reported. Only the places of the image's rarest line are tried (an index of the file's lines), at
  most MAX_POSITIONS_TRIED per file and patch (locate.py; past it TooCostlyToLocate, exit 3). HunkReport.line is
  the first file line matched (for a hunk without lines: the line it goes before); HunkReport.offset is where the
  whole hunk landed minus its header line.
* Classifying a hunk. Only the pre-image found => NOT_APPLIED; only the post-image => APPLIED; neither =>
  CONFLICT. Both found: the one nearer the expected line wins; on equal distance a non-empty image beats an
  empty one (a hunk without context matches anywhere), then an exact match beats a loose one (this tells apart
  hunks that only change line endings, or a CR at a line's end). A full tie is CONFLICT with a note starting
  "ambiguous": with repeated lines nothing tells "applied" from "not applied", and guessing could skip a change
  or apply it twice.
* Endings of inserted lines. When the pre-image matched exactly, the patch's own endings are used (a faithful
  diff of a mixed-ending file round-trips byte for byte). Otherwise an inserted line takes the ending of the line it
  replaces, else of the line before it, else of the line after it, else the file's dominant ending; LF when the
  file has none. New files take the patch's endings, LF where the patch carries none.
* Whole files. Creation: file absent => NOT_APPLIED; present with the same lines => APPLIED; else CONFLICT.
  Deletion: absent => APPLIED; the whole content equal to the removed lines => NOT_APPLIED; else CONFLICT.
* The near-match of a HunkConflict: the window of the file (as many lines as the hunk expects) most like the
  expected lines, whitespace aside, by difflib's ratio over lines; nearer the expected place wins a tie; none when
  no window shares a line with them. Its cost is linear in the file's size: a one-pass score per window, then the
  ratio for a bounded set of windows only (conflict.py says which).
* plan_file refuses (HunkConflict) when any hunk is in CONFLICT. A file where every hunk is APPLIED gives
  new == old. A PARTIAL file (some applied, the others applicable) gets the applicable hunks applied; both kinds
  are reported.

LAYOUT (one concept per module; plain functions, no I/O):

    model.py      HunkState, FileState, Hunk, FilePatch, HunkReport, FilePlan
    parse.py      parse_patch: unified diff bytes -> FilePatch records (with unidiff)
    reverse.py    reverse_file_patch, reverse_patches: the undoing patch(es)
    lines.py      the file line model: splitting on LF, endings, BOM, matching keys
    locate.py     hunk images and search shapes, finding hunks in order, per-hunk reports
    wholefile.py  creation and deletion of whole files
    conflict.py   HunkConflict construction and the near-match
    plan.py       scan_file, classify_file, plan_file, apply_patch_to_files; applying a hunk
    write.py      unified_diff: writing a byte-faithful diff
"""
from __future__ import annotations

from applier.diffengine.lines import BOM
from applier.diffengine.model import FilePatch, FilePlan, FileState, Hunk, HunkReport, HunkState
from applier.diffengine.parse import parse_patch
from applier.diffengine.plan import apply_patch_to_files, classify_file, plan_file, scan_file
from applier.diffengine.reverse import reverse_file_patch, reverse_patches
from applier.diffengine.write import unified_diff
# plan_file raises HunkConflict; callers catch it as diffengine.HunkConflict, as they did with the single module.
from applier.errors import HunkConflict  # noqa: F401  (not part of __all__)

__all__ = [
    "BOM", "FilePatch", "FilePlan", "FileState", "Hunk", "HunkReport", "HunkState", "apply_patch_to_files",
    "classify_file", "parse_patch", "plan_file", "reverse_file_patch", "reverse_patches", "scan_file",
    "unified_diff",
]
