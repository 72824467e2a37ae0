"""integrity: every file of every applied patch still has the bytes recorded at apply time."""
from __future__ import annotations

from ..registry import CheckResult, Outcome, check


@check("integrity", "every applied patch's files still have the sha256 recorded at apply time")
def integrity(ctx) -> CheckResult:
    name = "integrity"
    applied = ctx.applied
    if not applied:
        return CheckResult(name, Outcome.SKIP, "no patches are applied: nothing to check", {"applied": 0})
    recorded = {s.id: s for s in ctx.statuses() if s.id in applied}
    problems = {}
    for patch_id in sorted(applied):
        status = recorded.get(patch_id)
        # "lost" (an update replaced the file) and "modified" (edited since) are what applier.status reports.
        if status is None or status.state != "applied":
            files = [f"{f.path}: {f.state}" + (f" ({f.note})" if f.note else "")
                     for f in (status.files if status else []) if f.state != "applied"]
            problems[patch_id] = {"state": status.state if status else "unknown",
                                  "reason": status.reason if status else "no status computed", "files": files}
    numbers = {"applied": len(applied), "intact": sorted(set(applied) - set(problems)), "problems": problems}
    if problems:
        listed = "; ".join(f"{pid} {p['state']}" + (f" ({p['files'][0]})" if p["files"] else f" ({p['reason']})")
                           for pid, p in problems.items())
        return CheckResult(name, Outcome.FAIL, f"{len(problems)} of {len(applied)} applied patches changed since "
                                               f"apply: {listed}; see `applier status`", numbers)
    files = sum(len(getattr(a, "files", [])) for a in applied.values())
    return CheckResult(name, Outcome.PASS, f"{len(applied)} applied patches, {files} files, all as recorded",
                       numbers)
