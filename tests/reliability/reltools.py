"""Helpers of the reliability suite: installs to attack, the CLI (in-process and as a killable subprocess), and the
invariants an interrupted or refused run must leave behind.

An install here is a ComfyUI-shaped tree (tests/shelltools.make_comfy) with custom_nodes/ and, for overlay work, a
venv inside it (ComfyUI/venv), plus the two-patch test catalog (comfyui/maxres on nodes.py, comfyui/exec on
execution.py). Every check is made from the outside: the bytes and folders of the tree, the exit code and output of
the CLI, `status --json` and `overlay list --json`.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from click.testing import CliRunner

from shelltools import EXECUTION_PY, NODES_PY, REPO, make_catalog, make_comfy

DOCUMENTED = (0, 3, 4, 5, 7, 8, 9)       # applier/errors.py; 1 is "internal error", 2 a usage error
CATALOG_IDS = ("comfyui/exec", "comfyui/maxres")
PATCHED = {
    "nodes.py": NODES_PY.replace("MAX_RESOLUTION=16384", "MAX_RESOLUTION=40960").encode(),
    "execution.py": EXECUTION_PY.replace("def execute(node):\n",
                                         "def execute(node):\n    # retried once by the test patch\n").encode(),
}
FAILPOINT_EXIT = 77                      # applier/store/failpoints.py EXIT_CODE
SKIP_PARTS = {".applier", "__pycache__", ".git"}


# ------------------------------------------------------------------------------------------------- running the CLI

@dataclass
class Outcome:
    args: tuple
    code: int
    stdout: str
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout + self.stderr

    def json(self):
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"not JSON: {self}") from exc

    def __str__(self) -> str:
        return (f"applier {' '.join(map(str, self.args))} -> exit {self.code}\n--- stdout\n{self.stdout[-3000:]}"
                f"\n--- stderr\n{self.stderr[-3000:]}")


def problems_of(out: Outcome, allowed=DOCUMENTED) -> list[str]:
    """What is wrong with a run that must end cleanly: an undocumented exit code, a traceback, an internal error."""
    found = []
    if out.code not in allowed:
        found.append(f"exit {out.code} (expected one of {sorted(allowed)})")
    if "Traceback" in out.text:
        found.append("a traceback")
    if "internal error" in out.text:
        found.append("'internal error'")
    return found


def assert_clean(out: Outcome, allowed=DOCUMENTED) -> Outcome:
    found = problems_of(out, allowed)
    assert not found, f"{', '.join(found)}:\n{out}"
    return out


def cli(*args, env: dict | None = None) -> Outcome:
    """The CLI in this process (Click's runner): fast, and an escaping exception is reported as a traceback."""
    from applier.cli import cli as group
    args = tuple(str(a) for a in args)
    full_env = {"APPLIER_NO_GPU_PROBE": "1", "APPLIER_FAILPOINT": None, **(env or {})}
    result = CliRunner().invoke(group, list(args), env=full_env, prog_name="applier")
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return Outcome(args, result.exit_code, result.stdout, stderr)


def child_env(extra: dict | None = None) -> dict:
    base = {k: v for k, v in os.environ.items() if k != "APPLIER_FAILPOINT"}
    return {**base, "APPLIER_NO_GPU_PROBE": "1", "PYTHONPATH": str(REPO), **(extra or {})}


def run(*args, env: dict | None = None, timeout: float = 120, **popen) -> Outcome:
    """The CLI as a user runs it: `python -m applier ...` in a subprocess."""
    args = tuple(str(a) for a in args)
    proc = subprocess.run([sys.executable, "-m", "applier", *args], capture_output=True, text=True,
                          env=child_env(env), cwd=REPO, timeout=timeout, **popen)
    return Outcome(args, proc.returncode, proc.stdout, proc.stderr)


def run_writer():
    """The module of a run's writer, whose failpoint the race tests patch: applier.store.writer (an older product,
    the baseline `python -m benchmarks reliability` runs these tests against, kept it in heldroot)."""
    try:
        from applier.store import writer
    except ImportError:
        from applier.store import heldroot as writer
    return writer


REAL_FSYNC = os.fsync     # the suite's conftest turns fsync off in this process; forked runs get it back


def fork_cli(*args, env: dict | None = None, output: Path | None = None, before=None) -> int:
    """Run the CLI in a forked child of this process (its own process, killable like any other, without the
    0.3 s of interpreter start-up and imports a fresh `python -m applier` spends before the first write).
    Returns the child's pid; its stdout and stderr go to `output` (default: nowhere); before() runs in the child
    first (a limit to set)."""
    args = [str(a) for a in args]
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        os.fsync = REAL_FSYNC
        fd = os.open(output or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout = sys.stderr = open(fd, "w", buffering=1, closefd=False)
        os.environ.pop("APPLIER_FAILPOINT", None)
        os.environ.update({"APPLIER_NO_GPU_PROBE": "1", **(env or {})})
        if before is not None:
            before()
        from applier.cli import cli as group
        try:
            group.main(args, prog_name="applier", standalone_mode=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
    finally:
        os._exit(code)


def wait_exit(pid: int, timeout: float | None = None) -> int | None:
    """The child's exit code (-N: killed by signal N); None when it is still running after `timeout` s."""
    import time
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, 0 if deadline is None else os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.002)


# ------------------------------------------------------------------------------------------------- installs

@dataclass
class Install:
    root: Path                        # --target: the ComfyUI folder, or the outer folder of a portable install
    comfy: Path                       # the ComfyUI folder (nodes.py)
    site: Path | None                 # its site-packages (None: plain)
    catalog: Path                     # the two-patch test catalog
    layout: str                       # "portable" | "venv"
    base_files: dict = field(default_factory=dict)    # snapshot of the untouched tree
    base_dirs: set = field(default_factory=set)
    overlay: "Reference | None" = None                # what an installed overlay pack adds to the tree

    def args(self, *command) -> tuple:
        return (*command, "--target", self.root, "--patches", self.catalog)

    @property
    def journal(self) -> Path:
        return self.root / ".applier" / "journal.json"


def make_install(folder: Path, *, layout: str = "portable") -> Install:
    """portable: ComfyUI_windows_portable/{python_embeded/Lib/site-packages, ComfyUI/} without an interpreter (no
    subprocess per command: the fast one); venv: ComfyUI/ with a real venv inside it (ComfyUI/venv); plain: a
    ComfyUI folder without any Python env (no overlays), .applier/ inside the ComfyUI folder."""
    folder.mkdir(parents=True, exist_ok=True)
    if layout == "portable":
        root = folder / "ComfyUI_windows_portable"
        comfy = make_comfy(root)
        site = root / "python_embeded" / "Lib" / "site-packages"
        site.mkdir(parents=True)
    elif layout == "plain":
        root = comfy = make_comfy(folder)
        site = None
    elif layout == "venv":
        root = comfy = make_comfy(folder)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(comfy / "venv")], check=True,
                       capture_output=True)
        site = Path(subprocess.run([str(comfy / "venv" / "bin" / "python"), "-I", "-c",
                                    "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip())
    else:
        raise ValueError(layout)
    (comfy / "custom_nodes").mkdir()
    inst = Install(root, comfy, site, make_catalog(folder), layout)
    inst.base_files, inst.base_dirs = snapshot(root)
    inst.overlay = learn_reference(inst) if site is not None else None
    return inst


def snapshot(root: Path, *, skip=SKIP_PARTS) -> tuple[dict[str, bytes], set[str]]:
    """(relative path -> bytes, or b"link:" + target for symlinks; the set of folders), without .applier/."""
    files, dirs = {}, set()
    for folder, subdirs, names in os.walk(root):
        rel_folder = Path(folder).relative_to(root)
        subdirs[:] = [d for d in subdirs if d not in skip]
        for d in subdirs:
            path = Path(folder) / d
            rel = str(rel_folder / d)
            if path.is_symlink():
                files[rel] = b"link:" + os.readlink(path).encode()
            else:
                dirs.add(rel)
        for name in names:
            path = Path(folder) / name
            rel = str(rel_folder / name)
            files[rel] = b"link:" + os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
    return files, dirs


def strays(root: Path) -> list[str]:
    """Temp files of atomic writes (`.<name>.<random>.applier-tmp`) anywhere under root, .applier/ included."""
    return sorted(str(Path(f).relative_to(root) / n) for f, _, names in os.walk(root) for n in names
                  if n.endswith(".applier-tmp"))


def stash(root: Path, where: Path) -> Path:
    shutil.rmtree(where, ignore_errors=True)
    shutil.copytree(root, where, symlinks=True)
    return where


def restore(root: Path, saved: Path) -> None:
    """Put the tree back exactly as stashed, at the same path (state files may name absolute paths)."""
    shutil.rmtree(root)
    shutil.copytree(saved, root, symlinks=True)


def sha256(data: bytes) -> str:
    import hashlib
    return hashlib.sha256(data).hexdigest()


def state_files(inst: Install) -> dict[str, bytes]:
    """Every file of .applier/ but the lock and the folder's .gitignore (applier's own furniture)."""
    folder = inst.root / ".applier"
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in ("lock", ".gitignore")} if folder.is_dir() else {}


# ------------------------------------------------------------------------------------------------- expectations

@dataclass
class Reference:
    """What an installed overlay adds to an install, learnt once from an uninterrupted install."""
    files: dict[str, bytes]
    dirs: set[str]


def learn_reference(inst: Install) -> Reference:
    """What the pack adds to this install, from the pack itself (overlays/pack.toml): its package goes into
    site-packages, its node into custom_nodes/; every file but bytecode and caches, byte for byte."""
    import tomllib
    meta = tomllib.loads((REPO / "overlays" / "pack.toml").read_text(encoding="utf-8"))
    files: dict[str, bytes] = {}
    for source, dest in ((meta["package"], inst.site / meta["package"]),
                         (meta["node"], inst.comfy / "custom_nodes" / meta["node"])):
        src_root = REPO / "overlays" / source
        for path in sorted(src_root.rglob("*")):
            if path.is_file() and not {"__pycache__", ".pytest_cache"} & set(path.parts) \
                    and path.suffix not in (".pyc", ".pyo"):
                files[str((dest / path.relative_to(src_root)).relative_to(inst.root))] = path.read_bytes()
    dirs = {str(parent) for rel in files for parent in Path(rel).parents if str(parent) != "."}
    return Reference(files, dirs - inst.base_dirs)


STATES = {"catalog": ("original", "patched"), "overlay": ("absent", "installed")}


def expected_tree(inst: Install, catalog: str, overlay: str):
    files, dirs = dict(inst.base_files), set(inst.base_dirs)
    if catalog == "patched":
        files.update({str((inst.comfy / k).relative_to(inst.root)): v for k, v in PATCHED.items()})
    if overlay == "installed":
        files.update(inst.overlay.files)
        dirs |= inst.overlay.dirs
    return files, dirs


def classify(inst: Install) -> tuple[tuple[str, str] | None, str]:
    """((catalog state, overlay state), "") when the tree is exactly one of the four whole states, else
    (None, what differs from the nearest one)."""
    files, dirs = snapshot(inst.root)
    best = None
    for c in STATES["catalog"]:
        for o in STATES["overlay"] if inst.overlay is not None else ("absent",):
            want_files, want_dirs = expected_tree(inst, c, o)
            if files == want_files and dirs == want_dirs:
                return (c, o), ""
            diff = sorted({k for k in set(files) | set(want_files) if files.get(k) != want_files.get(k)})
            extra_dirs, missing_dirs = sorted(dirs - want_dirs), sorted(want_dirs - dirs)
            score = len(diff) + len(extra_dirs) + len(missing_dirs)
            if best is None or score < best[0]:
                best = (score, f"nearest whole state ({c}, {o}): files differing {diff[:8]}, "
                               f"folders extra {extra_dirs[:8]}, missing {missing_dirs[:8]}")
    return None, best[1]


def consistency_problems(inst: Install, allowed: set[tuple[str, str]]) -> list[str]:
    """Everything wrong with the tree after a recovery: torn files, stray temp files or folders, a pending journal,
    a state that disagrees with the files. Checked before any other command can tidy up."""
    found = []
    whole, why = classify(inst)
    if whole is None:
        found.append(f"not a whole state: {why}")
    elif whole not in allowed:
        found.append(f"whole state {whole}, expected one of {sorted(allowed)}")
    left = strays(inst.root)
    if left:
        found.append(f"temp files left: {left}")
    if inst.journal.exists():
        found.append("journal.json still pending")
    if whole is None:
        return found
    status = cli(*inst.args("status", "--json"))
    if status.code != 0 or problems_of(status):
        found.append(f"status after recovery: {status}")
    else:
        want = "applied" if whole[0] == "patched" else "not-applied"
        states = {p["id"]: p["state"] for p in status.json()["patches"]}
        if any(states.get(i) != want for i in CATALOG_IDS):
            found.append(f"status says {states}, files are {whole[0]}")
    listed = cli(*inst.args("overlay", "list", "--json"))
    if listed.code != 0 or problems_of(listed):
        found.append(f"overlay list after recovery: {listed}")
    elif inst.overlay is not None:
        data = listed.json()
        if whole[1] == "installed":
            n = len(inst.overlay.files)
            if not (data.get("installed") and data.get("intact") == n and not data.get("missing")
                    and not data.get("modified") and not data.get("interrupted")):
                found.append(f"overlay list says {data!r:.300}, all {n} overlay files are installed")
        elif data.get("installed"):
            found.append(f"overlay list says installed ({data!r:.300}), no overlay file is there")
    return found


def removal_problems(inst: Install) -> list[str]:
    """After `revert` and `overlay uninstall` the tree is the untouched one again: every file, every folder."""
    found = []
    for command in (("revert",), ("overlay", "uninstall")):
        out = cli(*inst.args(*command))
        if out.code != 0 or problems_of(out):
            found.append(f"{' '.join(command)}: {out}")
    files, dirs = snapshot(inst.root)
    if files != inst.base_files:
        differing = sorted(k for k in set(files) | set(inst.base_files) if files.get(k) != inst.base_files.get(k))
        found.append(f"files differ from the untouched tree: {differing[:8]}")
    if dirs != inst.base_dirs:
        found.append(f"folders left: {sorted(dirs - inst.base_dirs)[:8]}, missing: {sorted(inst.base_dirs - dirs)[:8]}")
    if strays(inst.root):
        found.append(f"temp files left: {strays(inst.root)}")
    return found


# ------------------------------------------------------------------------------------------------- the four commands

# command -> (its argv after "applier", the setup before it, the whole state before it, after it)
INTERRUPTED = {
    "apply": (("apply",), (), ("original", "absent"), ("patched", "absent")),
    "revert": (("revert",), (("apply",),), ("patched", "absent"), ("original", "absent")),
    "overlay-install": (("overlay", "install"), (), ("original", "absent"), ("original", "installed")),
    "overlay-uninstall": (("overlay", "uninstall"), (("overlay", "install"),), ("original", "installed"),
                          ("original", "absent")),
}
# the commands that must finish or roll back an interrupted run before doing their own work
NEXT = {
    "status": ("status",),
    "list": ("list",),
    "apply": ("apply",),
    "revert": ("revert",),
    "overlay-list": ("overlay", "list"),
    "overlay-uninstall": ("overlay", "uninstall"),
}


def effect_of(next_name: str, whole: tuple[str, str]) -> tuple[str, str]:
    """The whole state after the next command ran on a recovered tree in state `whole`."""
    c, o = whole
    if next_name == "apply":
        c = "patched"
    elif next_name == "revert":
        c = "original"
    elif next_name == "overlay-uninstall":
        o = "absent"
    return c, o


def set_up(inst: Install, command: str) -> None:
    for step in INTERRUPTED[command][1]:
        assert_clean(cli(*inst.args(*step)), allowed=(0,))


# ------------------------------------------------------------------------------------------------- figures

def record_figure(section: str, **values) -> None:
    """Extra figures for `python -m benchmarks reliability` (kills made, fuzz examples run): one JSON line each, to
    the file named by APPLIER_RELIABILITY_FIGURES when it is set."""
    target = os.environ.get("APPLIER_RELIABILITY_FIGURES")
    if not target:
        return
    with open(target, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"section": section, **values}) + "\n")
