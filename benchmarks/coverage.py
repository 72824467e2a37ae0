"""Write docs/coverage.md: which catalog variant applies to which cached upstream release.

    python -m benchmarks upstream torch --cache DIR      # fill DIR/torch (and the ComfyUI cache likewise)
    python -m benchmarks coverage --cache DIR

Exits 1 when the check finds problems (the file is still written, problems listed at its end).
"""
from __future__ import annotations

import datetime
import sys
from pathlib import Path

from applier.catalog import load_catalog
from applier.catalog.check import CellState, CoverageReport, check_catalog
from applier.resources import PATCHES_DIR

REPO = Path(__file__).resolve().parent.parent
CELL_TEXT = {
    CellState.CLEAN: "clean",
    CellState.FAILS: "**FAILS**",
    CellState.UNCLAIMED_APPLIES: "applies, not claimed",
    CellState.CLAIMED_MISSING: "**not cached**",
    CellState.NOT_APPLICABLE: "·",
}


def render(report: CoverageReport, today: datetime.date) -> str:
    lines = [
        "# Catalog coverage",
        "",
        f"Generated {today.isoformat()} by `python -m benchmarks coverage` from the upstream cache; do not edit by "
        "hand.",
        "Regenerate after changing a diff or a specifier, or after a new upstream release:",
        "",
        "    python -m benchmarks upstream torch --cache DIR        # pristine torch/cuda files per release",
        "    python -m benchmarks upstream comfyui --repo MIRROR --cache DIR   # ComfyUI snapshots from a git mirror",
        "    python -m benchmarks coverage --cache DIR",
        "",
        "Each cell dry-runs the variant's diff on that release's pristine files with the diff engine (no fuzz)",
        "and reverses it: `clean` = claimed by the variant's specifier, applies, and reverses to identical bytes;",
        "`FAILS` = claimed but does not apply; `applies, not claimed` = fits a release its specifier leaves out;",
        "`not cached` = listed in `tested` but absent from the cache; `·` = neither claimed nor applicable.",
        "Unversioned snapshots (old checkouts without a version) must have exactly one variant applying cleanly.",
        "",
    ]
    for component, versions in report.versions.items():
        rows = [r for r in report.rows if r.component == component]
        lines += [f"## {component}", "", "| patch | variant | versions | " + " | ".join(versions) + " |",
                  "|---|---|---|" + "---|" * len(versions)]
        for row in rows:
            cells = [CELL_TEXT[row.cell(v).state] if row.cell(v) else "" for v in versions]
            lines.append(f"| {row.patch_id} | {row.variant} | `{row.versions}` | " + " | ".join(cells) + " |")
        lines.append("")
    # One line per (variant, offsets) with every version it holds for: the list stays short as releases pile up.
    offsets: dict[tuple[str, str, str], list[str]] = {}
    for row in report.rows:
        for cell in row.cells:
            if cell.state is CellState.CLEAN and cell.detail:
                offsets.setdefault((row.patch_id, row.variant, cell.detail), []).append(cell.version)
    if offsets:
        lines += ["## Offsets", "", "Hunks found away from their header line (safe; reported by the engine):", ""]
        lines += [f"- {patch_id} {variant}: {detail} on {', '.join(versions)}"
                  for (patch_id, variant, detail), versions in offsets.items()]
        lines.append("")
    lines += ["## Problems", ""] + ([f"- {p}" for p in report.problems] or ["None."]) + [""]
    lines += ["## Warnings", ""] + ([f"- {w}" for w in report.warnings] or ["None."]) + [""]
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--cache", type=Path, required=True, help="upstream cache root (DIR)")
    parser.add_argument("--catalog", type=Path, default=PATCHES_DIR, help="catalog folder (default: patches/)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "coverage.md")


def run(args, parser=None) -> int:
    report = check_catalog(load_catalog(args.catalog), args.cache)
    args.out.write_text(render(report, datetime.date.today()), encoding="utf-8")
    print(f"wrote {args.out}: {len(report.rows)} variants, {len(report.problems)} problems, "
          f"{len(report.warnings)} warnings")
    for problem in report.problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 0 if report.ok else 1

