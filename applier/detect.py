"""Detection of a target: ComfyUI, its Python env, torch/CUDA/triton, GPU. Reads files; never imports torch.

The target's interpreter is asked once, in isolated UTF-8 mode, for its site-packages (a few ms: no torch import);
that query, git and nvidia-smi run through applier.subproc (a timeout, an output cap, strict UTF-8, the whole
process group ended). The files detection reads (comfyui_version.py, pyproject.toml, torch/version.py, METADATA)
are read bounded, only when regular and only where they really lie inside their folder (fsutil.read_inside): a
FIFO, /dev/zero or a link leading out is a note, never a hang nor a read outside the install. A site-packages found
inside the install folder that a link leads out of is not used (a note says so): a root applier writes into is
never reached through a link leading out of the install; an environment elsewhere is named with --python.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import stat
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.version import Version

from applier.errors import ApplierError, BadInterpreterError, BadTargetError, ChildFailure
from applier.settings import detect_timeout, gpu_probe_off
from applier.store.fsutil import kind_of, read_inside
from applier.store.paths import STATE_DIR_NAME, real_inside
from applier.store.state import read_interpreter
from applier.subproc import PYTHON_FLAGS, child_env, path_from_child, run_bounded
from applier.target import GPU, Target

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Seconds; APPLIER_DETECT_TIMEOUT (seconds) lowers every one of them (tests, slow disks' impatient users).
INTERPRETER_TIMEOUT_S = 20
GIT_TIMEOUT_S = 5
NVIDIA_SMI_TIMEOUT_S = 3
INTERPRETER_OUTPUT_LIMIT = 256 * 1024      # the answer is a few paths
TOOL_OUTPUT_LIMIT = 64 * 1024              # git's one line, nvidia-smi's one line per GPU
SOURCE_FILE_LIMIT = 256 * 1024             # comfyui_version.py, torch/version.py: a few lines
PYPROJECT_LIMIT = 1024 * 1024
METADATA_LIMIT = 4 * 1024 * 1024
MAX_VERSION_CHARS = 64                     # "2.14.1+cu130", "0.3.64": anything longer was not written by a release
MAX_GPUS = 64
# At most this many entries of a --target folder are looked at for ComfyUI folders inside it.
MAX_CHILDREN_LOOKED_AT = 1000

# Asked of the target's interpreter: stdlib only, no site customisation (-I), one JSON line.
# find_spec locates torch without executing it (a .pth file may put it outside site-packages).
SITE_QUERY = (
    "import importlib.util,json,site,sys,sysconfig;"
    "p=sysconfig.get_paths();"
    "g=getattr(site,'getsitepackages',lambda:[])();"
    "t=importlib.util.find_spec('torch');"
    "print(json.dumps({'version':'%d.%d.%d'%sys.version_info[:3],'prefix':sys.prefix,"
    "'purelib':p.get('purelib'),'platlib':p.get('platlib'),'site':g,"
    "'torch_dir':(t.submodule_search_locations or [None])[0] if t else None}))"
)
NOT_USABLE = "this is not a usable Python interpreter"
PYTHON_HINT = "give the target's interpreter with --python PATH (e.g. ComfyUI/venv/bin/python)"


class NotAnInterpreter(Exception):
    """The program asked for its site-packages gave no usable answer; str() says why, in words."""


@dataclass(frozen=True)
class InterpreterAnswer:
    version: str
    prefix: Path
    purelib: Path | None
    platlib: Path | None
    site: tuple[Path, ...]
    torch_dir: Path | None


def detect(target: str | Path, *, python: str | Path | None = None, gpu: bool = True) -> Target:
    """What is installed at target. `python` (--python) is resolved against the working directory and must be a
    usable interpreter (BadInterpreterError, exit 9, otherwise); one found by layout that does not answer is a
    note, and site-packages are then found by layout, so that commands that do not need it (revert) still run."""
    given = Path(target).expanduser()
    if not given.exists():
        raise BadTargetError(f"target {given} does not exist")
    if not given.is_dir():
        raise BadTargetError(f"target {given} is a file, not a folder", hint=folder_hint(given))
    given = given.resolve()
    notes: list[str] = []
    root, comfy_root = install_root(given)
    if root != given:
        notes.append(f"--target {given} belongs to the install at {root}: using that (one install, one state)")
        refuse_second_state(given, root)
    layout = detect_layout(root, comfy_root)
    if layout is None:
        raise BadTargetError(f"{root} holds neither ComfyUI (nodes.py) nor a Python environment",
                             hint=neither_hint(root))
    version, source, commit = (None, "unknown", None)
    if comfy_root is not None:
        version, source, commit = comfyui_version(comfy_root, notes)
    recorded = read_interpreter(root / STATE_DIR_NAME) if python is None else None
    if python is not None:
        interp, interp_source = given_interpreter(python), "--python"
    elif recorded is not None and os.path.lexists(recorded):
        # given once with --python (a conda env, a shared venv): used before any found by layout is even asked
        interp, interp_source = recorded, "state"
    else:
        interp, interp_source = find_interpreter(root, comfy_root, None)
        if recorded is not None:
            notes.append(f"the interpreter recorded for this install ({recorded}) is gone: pass --python PATH to "
                         "record another")
    found = Target(
        root=root, layout=layout, comfyui_root=comfy_root, comfyui_version=version,
        comfyui_version_source=source, comfyui_commit=commit, python=None, python_source="none",
        python_version=None, site_packages=None, torch_version=None, torch_cuda=None, triton_version=None,
        notes=notes,
    )
    found = with_interpreter(found, interp, source=interp_source, strict=interp_source == "--python")
    if gpu:
        found.gpus, found.gpu_problem = probe_gpus()
        if found.gpu_problem:
            found.notes.append(found.gpu_problem)
    return found


def with_interpreter(found: Target, python: Path | None, *, source: str, strict: bool = False) -> Target:
    """`found` with its Python part (interpreter, site-packages, torch, triton) detected for `python`.

    For an interpreter recorded in the state (source "state") or found by layout: one that does not answer is a
    note and `python_problem`, site-packages are found by layout beside it. strict (--python): such an
    interpreter is BadInterpreterError (exit 9) instead."""
    notes = [n for n in found.notes if n not in found.env_notes]
    python_version = problem = site_packages = purelib = None
    if python is not None:
        try:
            answer = ask_interpreter(python)
        except NotAnInterpreter as why:
            if strict:
                raise BadInterpreterError(f"--python {python}: {NOT_USABLE}: {why}", hint=PYTHON_HINT) from None
            problem = f"{NOT_USABLE}: {why}"
            notes.append(f"{python} ({source}): {problem}; site-packages found by layout; {PYTHON_HINT}")
            site_packages = static_site_packages(python)
        else:
            python_version = answer.version
            site_packages = pick_site_packages(answer)
            purelib = answer.purelib if answer.purelib is not None and answer.purelib.is_dir() else None
    elif found.layout == "portable":
        site_packages = first_existing([found.root / "python_embeded" / "Lib" / "site-packages"])
    site_problem = None
    if site_packages is not None and leads_out_of(found.root, site_packages):
        site_problem = (f"its site-packages {site_packages} is reached through a link leading out of the install "
                        f"(to {os.path.realpath(site_packages)})")
        notes.append(escaped_site_packages_note(found.root, site_packages, python))
        site_packages = None
    purelib = purelib or site_packages      # found by layout: the environment's own folder already
    if purelib is not None and leads_out_of(found.root, purelib):
        notes.append(escaped_site_packages_note(found.root, purelib, python))
        purelib = None
    if python is None and found.layout != "python-env":
        notes.append("no Python environment found (venv/, .venv/, python_embeded/): torch patches are not "
                     "applicable; use --python PATH")
    torch_version, torch_cuda = torch_versions(site_packages, notes)
    if site_packages is not None and torch_version is None:
        notes.append(f"torch is not installed in {site_packages}")
    env_notes = [n for n in notes if n not in found.notes or n in found.env_notes]
    return replace(found, python=python, python_source=source if python is not None else "none",
                   python_version=python_version, python_problem=problem, site_packages=site_packages,
                   site_packages_problem=site_problem, purelib=purelib,
                   torch_version=torch_version, torch_cuda=torch_cuda, triton_version=triton_version(site_packages),
                   notes=notes, env_notes=env_notes)


def leads_out_of(root: Path, path: Path) -> bool:
    """path lies in the install folder by name, but a link on its way leads out of it."""
    try:
        Path(path).relative_to(root)
    except ValueError:
        return False
    return not real_inside(root, path)


def escaped_site_packages_note(root: Path, site_packages: Path, python: Path | None) -> str:
    real = Path(os.path.realpath(site_packages))
    way_out = "put the folder itself in place of the link"
    if python is not None and leads_out_of(root, python.parent):   # the env itself lives elsewhere: name it there
        way_out = (f"if it is this install's environment, name its interpreter where it really is (--python "
                   f"{Path(os.path.realpath(python.parent)) / python.name}), or {way_out}")
    return (f"site-packages {site_packages} lies in the install by name, but a link leads it out of {root} (to "
            f"{real}): applier never writes or reads through a link leading out of the install, so torch patches "
            f"and the overlay package are not applicable; {way_out}")


def folder_hint(path: Path) -> str:
    """--target names a file: name the folder to give instead."""
    folder = path.parent if str(path.parent) else Path(".")
    if is_comfyui_folder(folder):
        return f"give the ComfyUI folder that holds it: --target {folder}"
    return f"give a folder: the ComfyUI folder, a portable install, or a venv (this file is in {folder})"


def neither_hint(root: Path) -> str:
    inside = comfyui_folders_in(root)
    if inside:
        return f"the ComfyUI folder inside it is {inside[0]}: --target {inside[0]}"
    return "point --target at the ComfyUI folder, a portable install, or a venv"


def install_root(given: Path) -> tuple[Path, Path | None]:
    """(the install's root, where .applier/ lives; the ComfyUI folder or None).

    One install has one state, whichever folder --target names: the ComfyUI folder, the folder holding it, a path
    inside it, or a portable install's outer folder all lead to the same root. The root is the portable install's
    outer folder (it holds python_embeded/, whose site-packages torch patches touch), else the ComfyUI folder; a
    target that is no ComfyUI install (a bare venv or prefix) is its own root. A folder holding several ComfyUI
    folders is refused (BadTargetError) rather than one picked."""
    comfy = given if is_comfyui_folder(given) else None
    if comfy is None:   # a folder inside an install (custom_nodes/, comfy/) belongs to it, whatever it holds
        comfy = next((folder for folder in given.parents if is_comfyui_folder(folder)), None)
    if comfy is None:
        comfy = find_comfyui_root(given)
    if comfy is None:
        return given, None
    if (comfy.parent / "python_embeded").is_dir():
        return comfy.parent, comfy
    return comfy, comfy


def refuse_second_state(given: Path, root: Path) -> None:
    """An older applier wrote its state wherever --target pointed: never leave two states for one install."""
    stray = given / ".applier"
    if not (stray / "state.json").exists() and not (stray / "overlays.json").exists():
        return
    if (root / ".applier").exists():
        raise BadTargetError(f"{stray} holds an applier state for the install at {root}, which has its own "
                             f"{root / '.applier'}: two states for one install",
                             hint="an older applier wrote the first one; compare them, merge by hand into "
                                  f"{root / '.applier'}, then remove {stray}")
    raise BadTargetError(f"{stray} holds the applier state of the install at {root} (written by an older applier "
                         "with --target on this folder)",
                         hint=f"move it where applier now keeps it: mv {stray} {root / '.applier'}")


def find_comfyui_root(root: Path) -> Path | None:
    """root itself when it is a ComfyUI folder; else its ComfyUI/ child, unless root holds more than one ComfyUI
    folder (a copy beside the original, two clones): then which one is meant is the user's call."""
    if is_comfyui_folder(root):
        return root
    inside = comfyui_folders_in(root)
    if len(inside) > 1:
        raise BadTargetError(f"{root} holds {len(inside)} ComfyUI folders: {', '.join(str(f) for f in inside)}",
                             hint="give the one you mean: " + " or ".join(f"--target {f}" for f in inside[:3]))
    candidate = root / "ComfyUI"
    if inside == [candidate] or (not inside and is_comfyui_folder(candidate)):   # (a folder we may not list)
        return candidate
    return None


def comfyui_folders_in(root: Path) -> list[Path]:
    """The ComfyUI folders directly inside root (the first MAX_CHILDREN_LOOKED_AT entries), sorted."""
    found = []
    try:
        with os.scandir(root) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_CHILDREN_LOOKED_AT:
                    break
                try:
                    if entry.is_dir() and is_comfyui_folder(Path(entry.path)):
                        found.append(Path(entry.path))
                except OSError:
                    continue
    except OSError:
        return []
    return sorted(found)


def is_comfyui_folder(folder: Path) -> bool:
    """nodes.py and execution.py; or one of them (or main.py) beside comfy/, so that a file an update or a user
    removed never hides the install (status and revert must still reach the other files); or an applier state
    that recorded ComfyUI patches here."""
    if (folder / "nodes.py").is_file() and (folder / "execution.py").is_file():
        return True
    if (folder / "comfy").is_dir() and any((folder / name).is_file() for name in ("nodes.py", "execution.py",
                                                                                   "main.py")):
        return True
    return (folder / ".applier" / "state.json").is_file() and any(
        (folder / name).is_file() for name in ("nodes.py", "execution.py"))


def detect_layout(root: Path, comfy_root: Path | None) -> str | None:
    if (root / "python_embeded").is_dir() and comfy_root is not None:
        return "portable"
    if comfy_root is not None:
        return "git-checkout" if (comfy_root / ".git").exists() else "plain"
    if is_python_env(root):
        return "python-env"
    return None


def is_python_env(root: Path) -> bool:
    return (root / "pyvenv.cfg").is_file() or any(root.glob("lib/python3*/site-packages")) \
        or (root / "Lib" / "site-packages").is_dir()


def interpreter_in(env: Path) -> Path | None:
    for rel in ("bin/python3", "bin/python", "Scripts/python.exe", "python.exe", "python3", "python"):
        candidate = env / rel
        if candidate.is_file():
            return candidate
    return None


def given_interpreter(python: str | Path) -> Path:
    """--python as a path: relative to the working directory (`python` and `./python` alike), never looked up on
    PATH, and no link resolved (a venv's bin/python is a link whose own folder makes it that venv's). It must be an
    executable regular file: BadInterpreterError (exit 9) saying what was tried otherwise."""
    given = os.fspath(python)
    path = Path(os.path.abspath(os.path.expanduser(given)))
    tried = f"looked for {path}" if str(path) != given else "no such file"
    if not os.path.lexists(path):
        raise BadInterpreterError(f"--python {given} does not exist ({tried}; applier never searches PATH)",
                                  hint="give the interpreter's path, e.g. --python ComfyUI/venv/bin/python or "
                                       '--python "$(command -v python3)"')
    try:
        st = path.stat()
    except OSError as exc:
        raise BadInterpreterError(f"--python {given}: cannot use {path}: {exc.strerror or exc}",
                                  hint=PYTHON_HINT) from None
    if stat.S_ISDIR(st.st_mode):
        inside = interpreter_in(path) or interpreter_in(path / "venv")
        raise BadInterpreterError(f"--python {given} is a folder ({path}), not an interpreter",
                                  hint=f"give the interpreter inside it: --python {inside}" if inside else PYTHON_HINT)
    if not stat.S_ISREG(st.st_mode):
        raise BadInterpreterError(f"--python {given} ({path}) is not a regular file", hint=PYTHON_HINT)
    if not os.access(path, os.X_OK):
        raise BadInterpreterError(f"--python {given} ({path}) is not executable", hint=PYTHON_HINT)
    return path


def find_interpreter(root: Path, comfy_root: Path | None, python: str | Path | None = None
                     ) -> tuple[Path | None, str]:
    """(the interpreter, where it was found): --python when given, else venv/, .venv/, python_embeded/, the
    prefix itself."""
    if python is not None:
        return given_interpreter(python), "--python"
    folders = [root, comfy_root] if comfy_root is not None and comfy_root != root else [root]
    for folder in folders:
        for name in ("venv", ".venv"):
            found = interpreter_in(folder / name)
            if found:
                return found, name
    found = interpreter_in(root / "python_embeded")
    if found:
        return found, "python_embeded"
    if is_python_env(root):
        found = interpreter_in(root)
        if found:
            return found, "prefix"
    return None, "none"


def ask_interpreter(python: Path) -> InterpreterAnswer:
    """The interpreter's site-packages, asked in isolated UTF-8 mode; NotAnInterpreter saying why otherwise."""
    special_venv_config(python)
    try:
        result = run_bounded([python, *PYTHON_FLAGS, "-c", SITE_QUERY], what="it",
                             timeout=detect_timeout(INTERPRETER_TIMEOUT_S),
                             stdout_limit=INTERPRETER_OUTPUT_LIMIT, stderr_limit=TOOL_OUTPUT_LIMIT, stderr_tail=True,
                             env=child_env())
        text = result.text()
    except ChildFailure as exc:
        raise NotAnInterpreter(exc.message) from None
    if result.returncode != 0:
        how = f"killed by signal {-result.returncode}" if result.returncode < 0 else \
            f"exited with status {result.returncode}"
        last = last_line(result.stderr.decode("utf-8", "replace"))
        raise NotAnInterpreter(f"it {how} when asked for its site-packages" + (f": {last[:200]}" if last else ""))
    return parse_site_answer(text)


def special_venv_config(python: Path) -> None:
    """NotAnInterpreter when the pyvenv.cfg the interpreter reads at start-up (beside it or one folder up) is a FIFO,
    a device or a socket: it would block or read forever before answering (it is not asked at all)."""
    for folder in (python.parent, python.parent.parent):
        try:
            st = os.stat(folder / "pyvenv.cfg")
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            raise NotAnInterpreter(f"its {folder / 'pyvenv.cfg'} is {kind_of(st.st_mode)}, not a regular file (it "
                                   "would hang at start-up): not run")


def parse_site_answer(text: str) -> InterpreterAnswer:
    """The answer to SITE_QUERY (its last stdout line), checked field by field; NotAnInterpreter otherwise."""
    line = last_line(text)
    if not line:
        raise NotAnInterpreter("it printed nothing when asked for its site-packages")
    shown = repr(line if len(line) <= 120 else line[:120] + "...")
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        raise NotAnInterpreter(f"its answer is not JSON: {shown}") from None
    if not isinstance(data, dict):
        raise NotAnInterpreter(f"its answer is JSON but not an object: {shown}")
    version = data.get("version")
    if version is None:
        raise NotAnInterpreter(f"its answer has no 'version': {shown}")
    if not isinstance(version, str) or not re.fullmatch(r"\d{1,3}\.\d{1,3}\.\d{1,3}", version):
        raise NotAnInterpreter(f"its 'version' is not a Python version: {version!r:.60}")

    def path(key: str, *, required: bool = False) -> Path | None:
        value = data.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value or len(value) > 4096:
            raise NotAnInterpreter(f"its answer's {key!r} is not a path: {value!r:.60}")
        try:
            return path_from_child(value)
        except ValueError as exc:
            raise NotAnInterpreter(f"its answer's {key!r} is not a file name ({exc})") from None

    site = data.get("site", [])
    if not isinstance(site, list) or len(site) > 64 or not all(isinstance(s, str) and s for s in site):
        raise NotAnInterpreter(f"its answer's 'site' is not a list of paths: {site!r:.60}")
    site_paths = []
    for entry in site:
        try:
            site_paths.append(path_from_child(entry))
        except ValueError as exc:
            raise NotAnInterpreter(f"its answer's 'site' holds something that is not a file name ({exc})") from None
    return InterpreterAnswer(version, path("prefix", required=True), path("purelib"), path("platlib"),
                             tuple(site_paths), path("torch_dir"))


def last_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()
    return ""


def pick_site_packages(answer: InterpreterAnswer) -> Path | None:
    """The folder that holds torch (where torch patches apply); else the env's own site-packages."""
    if answer.torch_dir is not None:
        return answer.torch_dir.parent
    paths = [p for p in (answer.purelib, answer.platlib, *answer.site) if p is not None]
    for path in paths:
        if (path / "torch").is_dir():
            return path
    return first_existing(paths)


def static_site_packages(python: Path) -> Path | None:
    env = python.parent.parent if python.parent.name in ("bin", "Scripts") else python.parent
    return first_existing([*sorted(env.glob("lib/python3*/site-packages")), env / "Lib" / "site-packages"])


def first_existing(paths) -> Path | None:
    for path in paths:
        if path.is_dir():
            return path
    return None


def read_detection_file(path: Path, limit: int, notes: list[str] | None, inside: Path) -> bytes | None:
    """A file detection reads, bounded, only when regular and only where it really lies inside `inside` (the
    ComfyUI folder, site-packages); None (and a note saying why, unless it is simply absent) otherwise."""
    try:
        return read_inside(inside, path, limit=limit)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ApplierError) as exc:
        if notes is not None:
            why = exc.message if isinstance(exc, ApplierError) else f"cannot read {path}: {exc.strerror or exc}"
            notes.append(f"{why}: ignored by detection")
        return None


def literal_assignments(path: Path, names: tuple[str, ...], notes: list[str] | None = None,
                        limit: int = SOURCE_FILE_LIMIT, *, inside: Path | None = None) -> dict[str, object]:
    """Top-level `NAME = <literal>` (or annotated) assignments of a Python file, read with ast, never imported;
    read only where it really lies inside `inside` (default: its own folder)."""
    data = read_detection_file(path, limit, notes, Path(path).parent if inside is None else inside)
    if data is None:
        return {}
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for t in targets:
            if isinstance(t, ast.Name) and t.id in names:
                try:
                    found[t.id] = ast.literal_eval(value)
                except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                    pass
    return found


def recognised_version(value: object) -> str | None:
    """value when it reads as a release version (PEP 440, at most MAX_VERSION_CHARS), else None."""
    if not isinstance(value, str) or not value or len(value) > MAX_VERSION_CHARS:
        return None
    try:
        Version(value)
    except ValueError:   # InvalidVersion, and a number past int's digit limit
        return None
    return value


def unrecognised(value: object, where: str) -> str:
    shown = repr(value)
    if len(shown) > 40:
        shown = f"{shown[:40]}... ({len(value) if isinstance(value, str) else len(shown)} characters)"
    return f"{where} says {shown}, which is not a version applier recognises: ignored"


def comfyui_version(comfy_root: Path, notes: list[str] | None = None) -> tuple[str | None, str, str | None]:
    """(version, where it came from, git commit)."""
    commit = git_output(comfy_root, "rev-parse", "--short", "HEAD") if (comfy_root / ".git").exists() else None
    raw = literal_assignments(comfy_root / "comfyui_version.py", ("__version__",), notes,
                              inside=comfy_root).get("__version__")
    version = recognised_version(raw)
    if version is not None:
        return version, "comfyui_version.py", commit
    if raw is not None and notes is not None:
        notes.append(unrecognised(raw, "comfyui_version.py"))
    data = read_detection_file(comfy_root / "pyproject.toml", PYPROJECT_LIMIT, notes, comfy_root)
    if data is not None:
        try:
            project = tomllib.loads(data.decode("utf-8"))
            raw = project.get("project", {}).get("version")
        except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError, AttributeError):
            raw = None
        version = recognised_version(raw)
        if version is not None:
            return version, "pyproject.toml", commit
        if raw is not None and notes is not None:
            notes.append(unrecognised(raw, "pyproject.toml"))
    if commit:
        tag = git_output(comfy_root, "describe", "--tags", "--exact-match", "HEAD")
        if tag and re.fullmatch(r"v?\d+(\.\d+)*", tag) and recognised_version(tag.lstrip("v")):
            return tag.lstrip("v"), "git tag", commit
        return None, "git commit", commit
    return None, "unknown", None


def git_output(folder: Path, *args: str) -> str | None:
    """git's one-line answer, None for anything else (no git, not a repository, a hang, garbage)."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        result = run_bounded([git, "-C", folder, *args], what="git", timeout=detect_timeout(GIT_TIMEOUT_S),
                             stdout_limit=TOOL_OUTPUT_LIMIT, stderr_limit=TOOL_OUTPUT_LIMIT, stderr_tail=True,
                             env=child_env({"GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0"}))
        text = result.text().strip()
    except ChildFailure:
        return None
    if result.returncode != 0 or not text or len(text) > 200 or "\n" in text:
        return None
    return text


def torch_versions(site_packages: Path | None, notes: list[str] | None = None) -> tuple[str | None, str | None]:
    """(__version__ with its local label, CUDA version) from torch/version.py; METADATA when it is absent."""
    if site_packages is None:
        return None, None
    found = literal_assignments(site_packages / "torch" / "version.py", ("__version__", "cuda"), notes,
                                inside=site_packages)
    raw = found.get("__version__")
    version = recognised_version(raw)
    if raw is not None and version is None and notes is not None:
        notes.append(unrecognised(raw, "torch/version.py"))
    cuda = found.get("cuda")
    if version is None:
        version = dist_version(site_packages, "torch", notes)
    cuda_ok = isinstance(cuda, str) and re.fullmatch(r"\d{1,3}(\.\d{1,3}){0,2}", cuda)
    return version, cuda if cuda_ok else None


def dist_version(site_packages: Path, name: str, notes: list[str] | None = None) -> str | None:
    prefix = name.replace("-", "_").lower() + "-"
    try:
        entries = sorted(entry for entry in os.listdir(site_packages)
                         if entry.lower().startswith(prefix) and entry.endswith(".dist-info"))
    except OSError:
        return None
    for entry in entries:
        data = read_detection_file(site_packages / entry / "METADATA", METADATA_LIMIT, notes, site_packages)
        if data is None:
            continue
        for line in data.decode("utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                return recognised_version(line.split(":", 1)[1].strip())
            if not line.strip():
                break
    return None


def triton_version(site_packages: Path | None) -> str | None:
    if site_packages is None:
        return None
    return dist_version(site_packages, "triton") or dist_version(site_packages, "triton-windows")


def probe_gpus() -> tuple[list[GPU], str | None]:
    """(GPUs from nvidia-smi, None) when present; ([], None) without one (or with APPLIER_NO_GPU_PROBE=1);
    ([], "GPU unknown: why") when it hangs, floods, prints bytes that are not UTF-8 or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None or gpu_probe_off():
        return [], None
    try:
        result = run_bounded([smi, "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader,nounits"],
                             what="nvidia-smi", timeout=detect_timeout(NVIDIA_SMI_TIMEOUT_S),
                             stdout_limit=TOOL_OUTPUT_LIMIT, stderr_limit=TOOL_OUTPUT_LIMIT, stderr_tail=True,
                             env=child_env())
        text = result.text()
    except ChildFailure as exc:
        return [], f"GPU unknown: {exc.message}"
    if result.returncode != 0:
        last = last_line(result.stderr.decode("utf-8", "replace")) or last_line(text)
        return [], f"GPU unknown: nvidia-smi exited with status {result.returncode}" + (
            f": {last[:200]}" if last else "")
    gpus = []
    for line in text.splitlines()[:MAX_GPUS]:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0] and len(parts[0]) <= 200:
            capability = parts[1] if re.fullmatch(r"\d{1,2}\.\d{1,2}", parts[1]) else None
            memory = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() and len(parts[2]) < 10 else None
            gpus.append(GPU(parts[0], capability, memory))
    if not gpus and text.strip():
        return [], f"GPU unknown: nvidia-smi printed no GPU line applier reads: {last_line(text)[:80]!r}"
    return gpus, None


def detect_gpus() -> list[GPU]:
    """GPUs from nvidia-smi when present (short timeout); an empty list otherwise."""
    return probe_gpus()[0]
