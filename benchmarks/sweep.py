"""The applier CLI against many real ComfyUI trees, with byte-identity after revert.

Given a ComfyUI git directory (a bare mirror is enough), it exports N commits spread evenly over the first-parent
history, every release tag (vX.Y.Z), and every release commit (the commit that set a new `__version__` in
comfyui_version.py, which is what a tag names where the mirror has no tags), each with `git archive` into a work
folder outside the repository. On each tree it runs the repository's own CLI (`python -m applier`, from this
checkout) as a user would:

    apply --json          which variant each comfyui patch chose, or why it was not applicable / refused
    status --json         must exit 0 after a successful apply
    revert --json         then every file must be byte-identical to the export, and nothing but .applier/ added

Trees given with --extra (folders prepared by hand outside the repository, e.g. from single files of releases newer
than the mirror; each may hold a SWEEP.json with {"label", "date", "commit", "source", "only": [patch ids]}) are
swept the same way.

    python -m benchmarks validate comfyui-sweep --mirror DIR -n 40 [--commit SHA ...] [--work DIR] [--extra DIR ...]

Writes benchmarks/results/comfyui-sweep.json (paths as placeholders). Nothing from ComfyUI is kept: each export is
deleted after its run.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .results import command_line, now, write_json

REPO = Path(__file__).resolve().parent.parent

OUT = REPO / "benchmarks" / "results" / "comfyui-sweep.json"
VERSION_RE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)
TAG_RE = re.compile(r"^v\d+\.\d+\.\d+$")


def git(git_dir: Path, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True,
                          text=True).stdout


def first_parent(git_dir: Path, branch: str) -> list[tuple[str, str]]:
    return [tuple(line.split()) for line in git(git_dir, "log", "--first-parent", "--reverse", "--format=%H %cs",
                                                  branch).splitlines() if line.strip()]


def release_commits(git_dir: Path, branch: str) -> dict[str, str]:
    """{sha: "vX.Y.Z"}: tags, and the commits that set a new comfyui_version.py version (first-parent)."""
    found = {}
    for line in git(git_dir, "tag", "--list").split():
        if TAG_RE.match(line):
            found[git(git_dir, "rev-list", "-n1", line).strip()] = line
    last = None
    for line in git(git_dir, "log", "--first-parent", "--reverse", "--format=%H", branch, "--",
                    "comfyui_version.py").split():
        text = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{line}:comfyui_version.py"],
                              capture_output=True, text=True).stdout
        match = VERSION_RE.search(text)
        if match and match.group(1) != last:
            last = match.group(1)
            found.setdefault(line, f"v{last}")
    return found


def spread(commits: list[tuple[str, str]], n: int) -> list[tuple[str, str]]:
    if n <= 0 or not commits:
        return []
    if n >= len(commits):
        return list(commits)
    step = (len(commits) - 1) / (n - 1) if n > 1 else 0
    return [commits[round(i * step)] for i in range(n)]


def snapshot(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if ".applier" in rel.parts or "__pycache__" in rel.parts:
            continue
        if path.is_symlink():
            out[rel.as_posix()] = "link:" + os.readlink(path)
        elif path.is_file():
            out[rel.as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def cli(*args: str) -> tuple[int, dict | None, str]:
    env = {**os.environ, "APPLIER_NO_GPU_PROBE": "1", "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "applier", *args, "--json"], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=600)
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        data = None
    return proc.returncode, data, proc.stderr.strip()


def error_text(data: dict | None, stderr: str) -> str:
    if data and isinstance(data.get("error"), dict):
        error = data["error"]
        return error.get("message", "") + (f" (hint: {error['hint']})" if error.get("hint") else "")
    return stderr.splitlines()[-1] if stderr else ""


def sweep_tree(tree: Path, only: list[str] | None = None) -> dict:
    """apply / status / revert on one exported tree; the outcome and what each comfyui patch did. `only` limits the
    run to some patches (a prepared tree that holds the lines of one file only)."""
    before = snapshot(tree)
    result: dict = {"patches": {}}
    selection = [arg for pid in (only or []) for arg in ("--only", pid)]
    code, data, stderr = cli("apply", "--target", str(tree), *selection)
    result["apply_exit"] = code
    if code != 0 or not data or "patches" not in data:
        result["outcome"] = "apply refused" if code == 3 else f"apply failed (exit {code})"
        result["reason"] = error_text(data, stderr)
        result["byte_identical"] = snapshot(tree) == before       # a refusal must change nothing
        return result
    for plan in data["patches"]:
        if plan["id"].startswith("comfyui/"):
            result["patches"][plan["id"]] = {"action": plan["action"], "variant": plan["variant"],
                                             "reason": plan["reason"]}
    code, data, stderr = cli("status", "--target", str(tree))
    result["status_exit"] = code
    code, data, stderr = cli("revert", "--target", str(tree), *selection)
    result["revert_exit"] = code
    after = snapshot(tree)
    result["byte_identical"] = after == before
    if not result["byte_identical"]:
        result["differs"] = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))[:10]
    ok = result["status_exit"] == 0 and code == 0 and result["byte_identical"]
    skipped = [pid for pid, p in result["patches"].items() if p["action"] == "not-applicable"]
    result["outcome"] = ("ok" if not skipped else "ok, some not applicable") if ok else "FAILED"
    return result


def export(git_dir: Path, sha: str, into: Path) -> list[str]:
    """The commit's tree written under `into`, as `git archive` would; returns the paths left out because the
    mirror lacks their blobs (snapshots of the code store omit files of 4 MiB and more, e.g. tokenizer JSON)."""
    try:
        archive = subprocess.run(["git", f"--git-dir={git_dir}", "archive", "--format=tar", sha],
                                 check=True, capture_output=True).stdout
    except subprocess.CalledProcessError:
        archive = None
    into.mkdir(parents=True)
    if archive is not None:
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, capture_output=True)
        return []
    listing = subprocess.run(["git", f"--git-dir={git_dir}", "ls-tree", "-r", "-z", sha], check=True,
                             capture_output=True).stdout.split(b"\0")
    entries = []
    for entry in filter(None, listing):
        meta, path = entry.split(b"\t", 1)
        mode, kind, blob = meta.split()
        if kind == b"blob":
            entries.append((mode.decode(), blob.decode(), path.decode("utf-8", "surrogateescape")))
    missing = []
    batch = subprocess.Popen(["git", f"--git-dir={git_dir}", "cat-file", "--batch"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    for mode, blob, path in entries:
        batch.stdin.write(blob.encode() + b"\n")
        batch.stdin.flush()
        header = batch.stdout.readline().split()
        if len(header) < 3 or header[1] == b"missing":
            missing.append(path)
            continue
        data = batch.stdout.read(int(header[2]))
        batch.stdout.read(1)
        target = into / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if mode == "120000":
            target.symlink_to(data.decode("utf-8", "surrogateescape"))
        else:
            target.write_bytes(data)
            if mode == "100755":
                target.chmod(0o755)
    batch.stdin.close()
    batch.wait()
    return missing


def read_version(tree: Path) -> str | None:
    path = tree / "comfyui_version.py"
    match = VERSION_RE.search(path.read_text(errors="replace")) if path.is_file() else None
    return match.group(1) if match else None


def add_arguments(parser) -> None:
    parser.add_argument("--mirror", type=Path, required=True, help="a ComfyUI git directory (bare is fine)")
    parser.add_argument("-n", type=int, default=40, help="commits spread over the history (plus every release)")
    parser.add_argument("--branch", default="master")
    parser.add_argument("--work", type=Path, default=None, help="where exports go (default: a temp folder)")
    parser.add_argument("--commit", action="append", default=[], help="a commit to sweep as well (repeatable)")
    parser.add_argument("--extra", type=Path, action="append", default=[], help="a prepared tree to sweep too")
    parser.add_argument("--out", type=Path, default=OUT)


def run(args, parser) -> int:
    work = args.work or Path(tempfile.mkdtemp(prefix="comfyui-sweep-"))
    if work.resolve().is_relative_to(REPO) and subprocess.run(
            ["git", "-C", str(REPO), "check-ignore", "-q", str(work)]).returncode != 0:
        parser.error("--work must lie outside the repository or in a folder git ignores "
                     "(nothing from ComfyUI may be committed)")
    history = first_parent(args.mirror, args.branch)
    releases = release_commits(args.mirror, args.branch)
    chosen = {sha: date for sha, date in spread(history, args.n)}
    chosen.update({sha: date for sha, date in history if sha in releases})
    wanted = [git(args.mirror, "rev-parse", c).strip() for c in args.commit]
    chosen.update({sha: date for sha, date in history if sha in wanted})
    order = [sha for sha, _ in history if sha in chosen]
    head = history[-1] if history else ("", "")

    rows = []
    for number, sha in enumerate(order, start=1):
        tree = work / sha[:10]
        missing = export(args.mirror, sha, tree)
        try:
            row = {"commit": sha[:10], "date": chosen[sha], "tag": releases.get(sha), "version": read_version(tree),
                   "source": "mirror", "files_absent_from_mirror": len(missing), **sweep_tree(tree)}
        finally:
            shutil.rmtree(tree, ignore_errors=True)
        rows.append(row)
        print(f"[{number}/{len(order)}] {row['commit']} {row['date']} {row['tag'] or '':>9} {row['outcome']}"
              + (f": {row.get('reason', '')[:100]}" if row.get("reason") else ""), flush=True)
    for extra in args.extra:
        meta = json.loads((extra / "SWEEP.json").read_text()) if (extra / "SWEEP.json").is_file() else {}
        copy = work / f"extra-{extra.name}"
        shutil.copytree(extra, copy, ignore=shutil.ignore_patterns("SWEEP.json"))
        try:
            row = {"commit": meta.get("commit"), "date": meta.get("date"), "tag": meta.get("label", extra.name),
                   "version": read_version(copy), "source": meta.get("source", "prepared tree"),
                   "only": meta.get("only"), **sweep_tree(copy, meta.get("only"))}
        finally:
            shutil.rmtree(copy, ignore_errors=True)
        rows.append(row)
        print(f"[extra] {row['tag']} {row['outcome']}" + (f": {row.get('reason', '')[:100]}"
                                                        if row.get("reason") else ""), flush=True)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)

    def tally(key):
        counts: dict[str, int] = {}
        for row in rows:
            counts[row[key]] = counts.get(row[key], 0) + 1
        return counts

    refused = [{"commit": r["commit"], "date": r["date"], "tag": r["tag"], "reason": r.get("reason")}
               for r in rows if r["outcome"] not in ("ok", "ok, some not applicable")]
    not_applicable = [{"commit": r["commit"], "date": r["date"], "tag": r["tag"], "patch": pid, "reason": p["reason"]}
                      for r in rows for pid, p in r["patches"].items() if p["action"] == "not-applicable"]
    report = {
        "kind": "comfyui-sweep",
        "environment": {"python": platform.python_version(), "platform": platform.platform(terse=True),
                        "date": now(),
                        "command": command_line().replace(str(args.mirror), "MIRROR"),
                        "applier_commit": subprocess.run(
                            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()},
        "mirror": {"head": head[0][:10], "head_date": head[1], "first_parent_commits": len(history),
                   "release_commits": len(releases), "spread_n": args.n},
        "summary": {"trees": len(rows), "outcomes": tally("outcome"),
                    "byte_identical_after_revert": sum(1 for r in rows if r["byte_identical"]),
                    "releases_ok": sum(1 for r in rows if r["tag"] and r["outcome"].startswith("ok"))},
        "refused": refused,
        "not_applicable": not_applicable,
        "trees": rows,
    }
    print(f"wrote {write_json(report, args.out, 'comfyui-sweep')}")
    failed = [r for r in rows if r["outcome"] == "FAILED" or not r["byte_identical"]]
    return 1 if failed else 0

