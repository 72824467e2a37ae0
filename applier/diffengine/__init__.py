"""The diff engine: pure functions, bytes in, bytes out, no file system.

This package hands names on; the code lives in its modules, one concept each. Its contract (the API the shell depends
on) and its rules (what "present", "found" and "ending" mean, how a hunk is located and classified) are
docs/diffengine.md.

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
