#!/usr/bin/env python3
"""Maintainer check: applier against real ComfyUI commits, with the real server answering before and after.

For every --commits rev it materialises the commit from a (possibly partial) git mirror into a fresh checkout
outside the repo, then:

  1. `applier detect --json`
  2. starts the real server (`main.py --cpu --listen 127.0.0.1 --port P ...`), reads EmptyLatentImage's width max
     from /object_info, stops it (stock value)
  3. `applier apply --only comfyui --json` (variant chosen and why)
  4. `applier verify --real-import --json`
  5. the server again (patched value)
  6. `applier revert --json`, then `git status --porcelain` against the status taken right after checkout

and writes everything (with timings, failures and their error tails) to one JSON file. Nothing from ComfyUI is
copied into this repo; the checkouts live under --work-dir and are removed at the end unless --keep.

Example:
    python3 scripts/validate_real_comfyui.py --repo MIRROR --python VENV/bin/python \
        --commits 4cea9aec a125cd84 --out benchmarks/results/real-comfyui.json
    (MIRROR: a bare ComfyUI git mirror; VENV: a venv with ComfyUI's requirements)
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import results_io  # noqa: E402  (stdlib only: the results' layout and path placeholders)
DEFAULT_APPLIER = REPO_ROOT / ".venv" / "bin" / "applier"
# Folders ComfyUI creates when it runs; untracked entries under them are expected after a server start.
RUNTIME_DIRS = ("output/", "input/", "temp/", "user/", "models/", "custom_nodes/", "__pycache__/")
SERVER_READY_TIMEOUT_S = 90.0
SERVER_STOP_GRACE_S = 10.0
TAIL_CHARS = 3000


def run(cmd: list[str], cwd: Path | None = None, timeout: float = 600, env: dict | None = None) -> dict:
    """Run a command; return rc, stdout, stderr and wall seconds (never raises on a non-zero exit)."""
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc = None
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = (exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")) + "\n[timed out]"
    return {"rc": rc, "stdout": out, "stderr": err, "seconds": round(time.monotonic() - start, 2)}


def git(repo: Path, *args: str, cwd_tree: Path | None = None) -> dict:
    if cwd_tree is not None:
        return run(["git", "-C", str(cwd_tree), *args])
    return run(["git", f"--git-dir={repo}", *args])


def materialise(repo: Path, sha: str, dest: Path) -> dict:
    """A real git checkout of `sha` at dest whose objects come from `repo` (alternates).

    `git worktree add` / `git archive` refuse when the mirror lacks a blob (large files are absent from the
    stored mirror), so files are written blob by blob and missing ones are listed; the index is the commit's
    tree, so `git status` shows missing blobs as deleted, identically before and after the applier runs."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    run(["git", "init", "-q", str(dest)])
    (dest / ".git" / "objects" / "info").mkdir(parents=True, exist_ok=True)
    (dest / ".git" / "objects" / "info" / "alternates").write_text(str(repo / "objects") + "\n")
    (dest / ".git" / "HEAD").write_text(sha + "\n")
    listing = subprocess.run(["git", f"--git-dir={repo}", "ls-tree", "-r", "-z", sha], capture_output=True,
                             check=True).stdout.split(b"\0")
    entries = []
    for item in listing:
        if not item:
            continue
        meta, path = item.split(b"\t", 1)
        mode, kind, blob = meta.decode().split()
        entries.append((mode, kind, blob, path.decode()))
    missing: list[str] = []
    cat = subprocess.Popen(["git", f"--git-dir={repo}", "cat-file", "--batch"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE)
    for mode, kind, blob, path in entries:
        if kind != "blob":  # submodules: nothing to write
            continue
        cat.stdin.write(blob.encode() + b"\n")
        cat.stdin.flush()
        header = cat.stdout.readline().split()
        if header[-1] == b"missing":
            missing.append(path)
            continue
        data = cat.stdout.read(int(header[2]))
        cat.stdout.read(1)  # the newline after each object
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if mode == "120000":
            os.symlink(data.decode(), target)
        else:
            target.write_bytes(data)
            if mode == "100755":
                target.chmod(0o755)
    cat.stdin.close()
    cat.wait()
    run(["git", "-C", str(dest), "read-tree", sha])
    run(["git", "-C", str(dest), "update-index", "-q", "--refresh"])
    return {"files_written": len(entries) - len(missing), "blobs_missing_in_mirror": missing}


def porcelain(tree: Path) -> list[str]:
    result = run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=all"])
    return [line for line in result["stdout"].splitlines() if line]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_flags(tree: Path, frontend_root: Path) -> list[str]:
    """The flags this era's comfy/cli_args.py knows (old eras lack some)."""
    cli_args = tree / "comfy" / "cli_args.py"
    text = cli_args.read_text(encoding="utf-8", errors="replace") if cli_args.exists() else ""
    flags = ["--cpu"]
    if '"--listen"' in text:
        flags += ["--listen", "127.0.0.1"]
    if '"--dont-print-server"' in text:
        flags.append("--dont-print-server")
    if '"--disable-auto-launch"' in text:
        flags.append("--disable-auto-launch")
    # Newer eras exit when comfyui-frontend-package is absent; an empty web root lets the API start without it.
    if '"--front-end-root"' in text:
        flags += ["--front-end-root", str(frontend_root)]
    return flags


def http_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read().decode("utf-8"))


def width_max(object_info: dict) -> int | None:
    node = object_info.get("EmptyLatentImage", object_info)
    try:
        return node["input"]["required"]["width"][1]["max"]
    except (KeyError, IndexError, TypeError):
        return None


def run_server(tree: Path, python: Path, frontend_root: Path, log_path: Path) -> dict:
    """Start the real server, wait until /object_info answers (at most 90 s), read the width max, stop it."""
    port = free_port()
    flags = server_flags(tree, frontend_root)
    cmd = [str(python), "main.py", *flags]
    if '"--port"' in (tree / "comfy" / "cli_args.py").read_text(errors="replace"):
        cmd += ["--port", str(port)]
    else:
        port = 8188
    report: dict = {"command": " ".join(cmd[1:]), "port": port}
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=tree, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        info = None
        endpoint = None
        try:
            while time.monotonic() - start < SERVER_READY_TIMEOUT_S:
                if proc.poll() is not None:
                    break
                try:
                    info = http_json(f"{base}/object_info/EmptyLatentImage")
                    endpoint = "/object_info/EmptyLatentImage"
                except urllib.error.HTTPError:  # old eras: only the full list
                    try:
                        info = http_json(f"{base}/object_info", timeout=30)
                        endpoint = "/object_info"
                    except (urllib.error.URLError, OSError, ValueError):
                        info = None
                except (urllib.error.URLError, OSError, ValueError):
                    info = None
                if info is not None:
                    break
                time.sleep(1.0)
            report["ready_seconds"] = round(time.monotonic() - start, 2) if info is not None else None
            if info is not None:
                report["endpoint"] = endpoint
                report["width_max"] = width_max(info)
                try:
                    report["system_stats_version"] = http_json(f"{base}/system_stats").get("system", {}).get(
                        "comfyui_version")
                except (urllib.error.URLError, OSError, ValueError):
                    report["system_stats_version"] = None
        finally:
            exited_early = proc.poll() is not None
            report["exit_code_before_stop"] = proc.returncode if exited_early else None
            if not exited_early:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(SERVER_STOP_GRACE_S)
                    report["stopped_by"] = "SIGTERM"
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    report["stopped_by"] = "SIGKILL"
    report["started"] = info is not None
    report["total_seconds"] = round(time.monotonic() - start, 2)
    if info is None:
        report["error_tail"] = log_path.read_text(errors="replace")[-TAIL_CHARS:]
        report["reason"] = ("exited with code %s before answering" % proc.returncode if exited_early
                            else f"no answer within {SERVER_READY_TIMEOUT_S:.0f} s")
    return report


def applier(applier_bin: Path, *args: str) -> dict:
    result = run([str(applier_bin), *args, "--json"], timeout=900)
    entry = {"rc": result["rc"], "seconds": result["seconds"]}
    try:
        entry["json"] = json.loads(result["stdout"])
    except ValueError:
        entry["stdout_tail"] = result["stdout"][-TAIL_CHARS:]
    if result["rc"] not in (0, None) or "json" not in entry:
        entry["stderr_tail"] = result["stderr"][-TAIL_CHARS:]
    return entry


def summarise_apply(apply_json: dict | None) -> list[dict]:
    """The patch id, variant and reason of every patch the apply report mentions, whatever its nesting."""
    found: list[dict] = []

    def walk(node):
        if isinstance(node, dict):
            if "id" in node and ("variant" in node or "status" in node or "outcome" in node):
                found.append({k: node[k] for k in ("id", "variant", "reason", "status", "outcome", "action")
                              if k in node})
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(apply_json)
    return found


def summarise_verify(verify_json: dict | None) -> list[dict]:
    checks = (verify_json or {}).get("checks", [])
    return [{k: c.get(k) for k in ("name", "outcome", "status", "reason", "measured") if k in c} for c in checks]


def classify_leftovers(lines: list[str], baseline: list[str]) -> dict:
    new = [line for line in lines if line not in baseline]
    runtime = [line for line in new if line.startswith("?? ") and line[3:].startswith(RUNTIME_DIRS)]
    other = [line for line in new if line not in runtime]
    return {"new_since_checkout": new, "runtime_untracked": runtime, "unexpected": other}


def validate_rev(args, rev: str, frontend_root: Path) -> dict:
    repo = args.repo
    sha = git(repo, "rev-parse", rev + "^{commit}")["stdout"].strip()
    entry: dict = {"rev": rev, "commit": sha,
                   "date": git(repo, "show", "-s", "--format=%cI", sha)["stdout"].strip(),
                   "subject": git(repo, "show", "-s", "--format=%s", sha)["stdout"].strip()}
    version_file = git(repo, "show", f"{sha}:comfyui_version.py")
    entry["version_file"] = None
    for line in version_file["stdout"].splitlines():
        if line.startswith("__version__"):
            entry["version_file"] = line.split("=", 1)[1].strip().strip("\"'")
    nodes_text = git(repo, "show", f"{sha}:nodes.py")["stdout"]
    entry["stock_max_resolution_line"] = next((line for line in nodes_text.splitlines()
                                               if line.startswith("MAX_RESOLUTION")), None)
    tree = args.work_dir / sha[:12]
    timings: dict = {}
    t0 = time.monotonic()
    entry["checkout"] = materialise(repo, sha, tree)
    timings["checkout"] = round(time.monotonic() - t0, 2)
    baseline = porcelain(tree)
    entry["git_status_after_checkout"] = baseline
    py = str(args.python)

    detect = applier(args.applier, "detect", "--target", str(tree), "--python", py)
    entry["detect"] = detect.get("json", detect)
    timings["detect"] = detect["seconds"]

    entry["server_before"] = run_server(tree, args.python, frontend_root, args.work_dir / f"{sha[:12]}-before.log")
    timings["server_before"] = entry["server_before"]["total_seconds"]

    apply = applier(args.applier, "apply", "--target", str(tree), "--python", py, "--only", "comfyui")
    entry["apply"] = {"rc": apply["rc"], "patches": summarise_apply(apply.get("json")), "report": apply.get("json"),
                      **{k: apply[k] for k in ("stderr_tail", "stdout_tail") if k in apply}}
    timings["apply"] = apply["seconds"]
    entry["git_status_after_apply"] = porcelain(tree)

    verify = applier(args.applier, "verify", "--target", str(tree), "--python", py, "--real-import")
    entry["verify"] = {"rc": verify["rc"], "checks": summarise_verify(verify.get("json")),
                       **{k: verify[k] for k in ("stderr_tail", "stdout_tail") if k in verify}}
    timings["verify"] = verify["seconds"]

    entry["server_after"] = run_server(tree, args.python, frontend_root, args.work_dir / f"{sha[:12]}-after.log")
    timings["server_after"] = entry["server_after"]["total_seconds"]

    revert = applier(args.applier, "revert", "--target", str(tree), "--python", py)
    entry["revert"] = {"rc": revert["rc"], "report": revert.get("json"),
                       **{k: revert[k] for k in ("stderr_tail", "stdout_tail") if k in revert}}
    timings["revert"] = revert["seconds"]

    after = porcelain(tree)
    entry["git_status_after_revert"] = after
    leftovers = classify_leftovers(after, baseline)
    entry["leftovers"] = leftovers
    diff = run(["git", "-C", str(tree), "diff", "--stat"])
    entry["git_diff_stat_after_revert"] = diff["stdout"].strip()
    # Byte-identical: no tracked file differs from the commit beyond what was already absent at checkout.
    entry["byte_identical"] = not leftovers["unexpected"] and not [
        line for line in after if not line.startswith("??") and line not in baseline]
    entry["timings_s"] = timings
    return entry


def environment(python: Path, applier_bin: Path) -> dict:
    probe = run([str(python), "-c", "import sys, json, torch; print(json.dumps({'python': sys.version, "
                 "'torch': torch.__version__, 'cuda': torch.version.cuda, 'torch_file': torch.__file__}))"], timeout=120)
    env: dict = {"host_python": sys.version, "platform": platform.platform(),
                 "applier_version": run([str(applier_bin), "--version"])["stdout"].strip(),
                 "applier_commit": run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"])["stdout"].strip(),
                 "target_python_path": str(python),
                 "target_pip_freeze": run([str(python), "-m", "pip", "freeze", "--all"], timeout=120)["stdout"].split()}
    try:
        env["target"] = json.loads(probe["stdout"].strip().splitlines()[-1])
    except (ValueError, IndexError):
        env["target"] = {"error_tail": probe["stderr"][-TAIL_CHARS:]}
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="bare ComfyUI git dir (may lack large blobs)")
    parser.add_argument("--python", type=Path, required=True, help="interpreter with ComfyUI's requirements")
    parser.add_argument("--commits", nargs="+", required=True, help="revs to check, oldest first")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--applier", type=Path, default=DEFAULT_APPLIER)
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "realcomfy",
                        help="where the checkouts go, outside this repo (default: realcomfy in the temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the checkouts and server logs")
    args = parser.parse_args()
    args.repo = args.repo.resolve()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    if REPO_ROOT in args.work_dir.resolve().parents:
        parser.error("--work-dir must lie outside this repo (ComfyUI code never enters it)")
    frontend_root = args.work_dir / "empty-frontend"
    frontend_root.mkdir(exist_ok=True)

    started = time.monotonic()
    result = {"generated": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "script": "scripts/validate_real_comfyui.py", "command": results_io.command_line(),
              "repo": str(args.repo),
              "environment": environment(args.python, args.applier), "revs": []}
    for rev in args.commits:
        print(f"== {rev}", flush=True)
        try:
            entry = validate_rev(args, rev, frontend_root)
        except Exception as exc:  # one broken rev must not hide the others
            entry = {"rev": rev, "error": f"{type(exc).__name__}: {exc}"}
        result["revs"].append(entry)
        print(json.dumps({k: entry.get(k) for k in ("commit", "date", "version_file", "byte_identical")}),
              f"before={entry.get('server_before', {}).get('width_max')}",
              f"after={entry.get('server_after', {}).get('width_max')}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(results_io.dumps(results_io.scrub(result)) + "\n")    # kept after each rev
    result["total_seconds"] = round(time.monotonic() - started, 1)
    if not args.keep:
        for entry in result["revs"]:
            if entry.get("commit"):
                shutil.rmtree(args.work_dir / entry["commit"][:12], ignore_errors=True)
        result["checkouts_removed"] = True
    results_io.write_json(result, args.out, "real-comfyui")
    return 0


if __name__ == "__main__":
    sys.exit(main())
