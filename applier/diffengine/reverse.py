"""Reversing: the patch that undoes a patch (before and after swapped, creation <-> deletion), a transform applied
once before the same plan (as patch-package's reversePatch), never a flag of the planner."""
from __future__ import annotations

from applier.diffengine.model import FilePatch, Hunk

def reverse_file_patch(fp: FilePatch) -> FilePatch:
    """The patch that undoes `fp`: before and after swapped, creation <-> deletion."""
    return FilePatch(path=fp.path, is_new=fp.is_deleted, is_deleted=fp.is_new,
                     hunks=tuple(_reverse_hunk(hunk) for hunk in fp.hunks))


def reverse_patches(patches: list[FilePatch]) -> list[FilePatch]:
    """The patches that undo `patches` applied in order: each one reversed, the last one first."""
    return [reverse_file_patch(fp) for fp in reversed(patches)]


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
