"""Fill the ComfyUI upstream cache that the comfyui/* catalog variants are checked against.

ComfyUI is not on any package registry; its history is read from a local git directory (a bare mirror is enough).
Only the files the catalog's diffs and version detection need are extracted, never committed:

    <cache>/comfyui/<label>/{nodes.py, execution.py, comfyui_version.py, pyproject.toml}
    <cache>/comfyui/<label>/SNAPSHOT.json      # label, commit, date, version, why this commit was taken

Which commits are taken (first-parent history of the branch):

- Versioned era (comfyui_version.py exists, since 0.3.10 on 2025-01-11): the LAST commit of each `__version__`,
  labelled by the version ("0.3.64"); and, where the patch-relevant regions (below) differ between the two, also
  the release commit that bumped the version (what the tag and stable users have), labelled "0.3.44-release".
- Earlier: the history is cut into runs of commits whose patch-relevant regions are identical (the lines around
  `MAX_RESOLUTION=` and `NODE_CLASS_MAPPINGS = {` in nodes.py, the line that calls `get_output_data(` and the OOM
  handler in execution.py); the last commit of each run is taken, labelled "unversioned-YYYY-MM-DD-<sha7>". Commits
  before MAX_RESOLUTION existed (2023-03-22) have nothing to patch and are skipped.

Usage:

    python -m benchmarks upstream comfyui --repo MIRROR --cache DIR

MIRROR is a ComfyUI git directory (a bare mirror); DIR the cache root that `applier catalog check --cache DIR`
and the tests (APPLIER_UPSTREAM_CACHE=DIR) read.

A label already in the cache is left alone unless --force.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

KEPT_FILES = ("nodes.py", "execution.py", "comfyui_version.py", "pyproject.toml")
VERSION_RE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)

# (file, anchor regex, lines kept before, lines kept after): the regions the comfyui/* diffs touch or rely on.
ANCHORS = (
    ("nodes.py", re.compile(r"^MAX_RESOLUTION\s*="), 3, 3),
    ("nodes.py", re.compile(r"^NODE_CLASS_MAPPINGS = \{"), 2, 2),
    ("execution.py", re.compile(r"=\s*(await\s+)?get_output_data\("), 2, 2),
    ("execution.py", re.compile(r"OOM_EXCEPTION|is_oom\("), 2, 3),
)


class Git:
    def __init__(self, git_dir: Path):
        self.git_dir = git_dir

    def run(self, *args: str) -> str:
        out = subprocess.run(["git", f"--git-dir={self.git_dir}", *args], check=True, capture_output=True)
        return out.stdout.decode("utf-8", "replace")

    def show_bytes(self, commit: str, path: str) -> bytes | None:
        out = subprocess.run(["git", f"--git-dir={self.git_dir}", "show", f"{commit}:{path}"], capture_output=True)
        return out.stdout if out.returncode == 0 else None

    def first_parent_commits(self, branch: str, *paths: str) -> list[tuple[str, str]]:
        """(sha, YYYY-MM-DD) oldest first, following the first parent (the branch as its users saw it)."""
        args = ["log", "--first-parent", "--reverse", "--format=%H %cs", branch]
        if paths:
            args += ["--", *paths]
        return [tuple(line.split()) for line in self.run(*args).splitlines() if line.strip()]


@dataclass
class Snapshot:
    label: str
    commit: str
    date: str
    version: str | None
    reason: str


def read_version(text: bytes | None) -> str | None:
    if text is None:
        return None
    match = VERSION_RE.search(text.decode("utf-8", "replace"))
    return match.group(1) if match else None


def versioned_snapshots(git: Git, branch: str) -> list[Snapshot]:
    """The last commit of each comfyui_version.py version (and its release commit where the regions differ)."""
    commits = git.first_parent_commits(branch)
    index_of = {sha: i for i, (sha, _) in enumerate(commits)}
    # (version, index of the commit that set it); a commit that rewrote the file without a new version is no bump.
    bumps: list[tuple[str, int]] = []
    for sha, _ in git.first_parent_commits(branch, "comfyui_version.py"):
        version = read_version(git.show_bytes(sha, "comfyui_version.py"))
        if version is not None and (not bumps or bumps[-1][0] != version):
            bumps.append((version, index_of[sha]))
    snapshots = []
    for n, (version, first) in enumerate(bumps):
        last = bumps[n + 1][1] - 1 if n + 1 < len(bumps) else len(commits) - 1
        (release_sha, release_date), (last_sha, last_date) = commits[first], commits[last]
        snapshots.append(Snapshot(version, last_sha, last_date, version, f"last commit of {version}"))
        # Stable users sit on the release commit (the version bump, which the tag names); nightly users on later
        # commits that still report the same version. Keep the release too when the patched regions differ.
        if release_sha != last_sha and fingerprint_at(git, release_sha) != fingerprint_at(git, last_sha):
            snapshots.append(Snapshot(f"{version}-release", release_sha, release_date, version,
                                      f"release commit of {version}; its patch regions differ from {last_sha[:7]}"))
    return snapshots


def fingerprint_at(git: Git, commit: str) -> tuple:
    return region_fingerprint({name: git.show_bytes(commit, name) for name in ("nodes.py", "execution.py")})


def region_fingerprint(files: dict[str, bytes | None]) -> tuple:
    parts = []
    for name, anchor, before, after in ANCHORS:
        data = files.get(name)
        lines = data.decode("utf-8", "replace").splitlines() if data is not None else []
        hits = [i for i, line in enumerate(lines) if anchor.search(line)]
        parts.append(tuple(tuple(lines[max(0, i - before):i + after + 1]) for i in hits))
    return tuple(parts)


def unversioned_snapshots(git: Git, branch: str, first_versioned: str | None) -> list[Snapshot]:
    """One snapshot per run of identical patch-relevant regions before comfyui_version.py existed."""
    commits = git.first_parent_commits(branch, "nodes.py", "execution.py")
    if first_versioned is not None:
        cutoff = {sha for sha, _ in git.first_parent_commits(first_versioned)}
        commits = [(sha, date) for sha, date in commits if sha in cutoff and sha != first_versioned]
    runs: list[list] = []          # [fingerprint, first (sha, date), last (sha, date)]
    for sha, date in commits:
        files = {name: git.show_bytes(sha, name) for name in ("nodes.py", "execution.py")}
        if not region_fingerprint(files)[0]:
            continue                # no MAX_RESOLUTION yet: nothing the catalog patches
        fingerprint = region_fingerprint(files)
        if runs and runs[-1][0] == fingerprint:
            runs[-1][2] = (sha, date)
        else:
            runs.append([fingerprint, (sha, date), (sha, date)])
    snapshots = []
    for _, (first_sha, first_date), (sha, date) in runs:
        label = f"unversioned-{date}-{sha[:7]}"
        reason = f"last commit of a run of identical patch regions that began at {first_sha[:7]} ({first_date})"
        snapshots.append(Snapshot(label, sha, date, None, reason))
    return snapshots


def extract(git: Git, snap: Snapshot, cache_root: Path, force: bool) -> str:
    folder = cache_root / "comfyui" / snap.label
    if (folder / "SNAPSHOT.json").is_file() and not force:
        return "cached"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    kept = []
    for name in KEPT_FILES:
        data = git.show_bytes(snap.commit, name)
        if data is not None:
            (folder / name).write_bytes(data)
            kept.append(name)
    meta = {"label": snap.label, "commit": snap.commit, "date": snap.date, "version": snap.version,
            "reason": snap.reason, "files": kept}
    (folder / "SNAPSHOT.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return "written"


def add_arguments(parser) -> None:
    parser.add_argument("--repo", type=Path, required=True, help="a ComfyUI git directory (bare is fine)")
    parser.add_argument("--cache", type=Path, required=True, help="cache root (comfyui/ is created in it)")
    parser.add_argument("--branch", default="master")
    parser.add_argument("--force", action="store_true", help="rewrite labels already cached")


def run(args, parser=None) -> int:

    git = Git(args.repo)
    versioned = versioned_snapshots(git, args.branch)
    first_versioned = git.first_parent_commits(args.branch, "comfyui_version.py")
    first_sha = first_versioned[0][0] if first_versioned else None
    unversioned = unversioned_snapshots(git, args.branch, first_sha)
    for snap in [*unversioned, *versioned]:
        outcome = extract(git, snap, args.cache, args.force)
        print(f"{snap.label:<32} {snap.commit[:10]} {snap.date} {outcome}")
    print(f"{len(unversioned)} unversioned + {len(versioned)} versioned snapshots in {args.cache / 'comfyui'}")
    return 0

