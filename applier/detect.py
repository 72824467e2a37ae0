"""Detection of a target: ComfyUI, its Python env, torch/CUDA/triton, GPU. Reads files; never imports torch.

The target's interpreter is asked once, in isolated mode, for its site-packages (a few ms: no torch import).
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from applier.errors import BadTargetError
from applier.target import GPU, Target

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

INTERPRETER_TIMEOUT_S = 20
NVIDIA_SMI_TIMEOUT_S = 3

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


def detect(target: str | Path, *, python: str | Path | None = None, gpu: bool = True) -> Target:
    given = Path(target).expanduser()
    if not given.exists():
        raise BadTargetError(f"target {given} does not exist")
    if not given.is_dir():
        raise BadTargetError(f"target {given} is not a folder")
    given = given.resolve()
    notes: list[str] = []
    root, comfy_root = install_root(given)
    if root != given:
        notes.append(f"--target {given} belongs to the install at {root}: using that (one install, one state)")
        refuse_second_state(given, root)
    layout = detect_layout(root, comfy_root)
    if layout is None:
        raise BadTargetError(f"{root} holds neither ComfyUI (nodes.py) nor a Python environment",
                             hint="point --target at the ComfyUI folder, a portable install, or a venv")
    version, source, commit = (None, "unknown", None)
    if comfy_root is not None:
        version, source, commit = comfyui_version(comfy_root)
    interp, interp_source = find_interpreter(root, comfy_root, python)
    python_version = None
    site_packages = None
    if interp is not None:
        info = query_interpreter(interp)
        if info is None and interp_source == "--python":
            raise BadTargetError(f"--python {python} is not a Python interpreter that runs here (it did not answer "
                                 "`-I -c` with its site-packages)",
                                 hint="give the target's python executable, e.g. ComfyUI/venv/bin/python")
        if info is None:
            notes.append(f"{interp} did not answer (not runnable on this machine?); site-packages found by layout")
            site_packages = static_site_packages(interp)
        else:
            python_version = info["version"]
            site_packages = pick_site_packages(info)
    elif layout == "portable":
        site_packages = first_existing([root / "python_embeded" / "Lib" / "site-packages"])
    if interp is None and layout != "python-env":
        notes.append("no Python environment found (venv/, .venv/, python_embeded/): torch patches are not "
                     "applicable; use --python PATH")
    torch_version, torch_cuda = torch_versions(site_packages)
    if site_packages is not None and torch_version is None:
        notes.append(f"torch is not installed in {site_packages}")
    return Target(
        root=root, layout=layout, comfyui_root=comfy_root, comfyui_version=version,
        comfyui_version_source=source, comfyui_commit=commit, python=interp, python_source=interp_source,
        python_version=python_version, site_packages=site_packages, torch_version=torch_version,
        torch_cuda=torch_cuda, triton_version=triton_version(site_packages),
        gpus=detect_gpus() if gpu else [], notes=notes,
    )


def install_root(given: Path) -> tuple[Path, Path | None]:
    """(the install's root, where .applier/ lives; the ComfyUI folder or None).

    One install has one state, whichever folder --target names: the ComfyUI folder, the folder holding it, a path
    inside it, or a portable install's outer folder all lead to the same root. The root is the portable install's
    outer folder (it holds python_embeded/, whose site-packages torch patches touch), else the ComfyUI folder; a
    target that is no ComfyUI install (a bare venv or prefix) is its own root."""
    comfy = find_comfyui_root(given)
    if comfy is None:
        comfy = next((folder for folder in given.parents if is_comfyui_folder(folder)), None)
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
    for candidate in (root, root / "ComfyUI"):
        if is_comfyui_folder(candidate):
            return candidate
    return None


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


def find_interpreter(root: Path, comfy_root: Path | None, python: str | Path | None) -> tuple[Path | None, str]:
    if python is not None:
        path = Path(python).expanduser()
        if not path.exists():
            found = shutil.which(str(python))
            if not found:
                raise BadTargetError(f"--python {python} does not exist")
            path = Path(found)
        return path, "--python"
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


def query_interpreter(python: Path) -> dict | None:
    try:
        proc = subprocess.run([str(python), "-I", "-c", SITE_QUERY], capture_output=True, text=True,
                              timeout=INTERPRETER_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return None


def pick_site_packages(info: dict) -> Path | None:
    """The folder that holds torch (where torch patches apply); else the env's own site-packages."""
    if info.get("torch_dir"):
        return Path(info["torch_dir"]).parent
    candidates = [info.get("purelib"), info.get("platlib"), *info.get("site", [])]
    paths = [Path(c) for c in candidates if c]
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


def literal_assignments(path: Path, names: tuple[str, ...]) -> dict[str, object]:
    """Top-level `NAME = <literal>` (or annotated) assignments of a Python file, read with ast, never imported."""
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
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
                except ValueError:
                    pass
    return found


def comfyui_version(comfy_root: Path) -> tuple[str | None, str, str | None]:
    """(version, where it came from, git commit)."""
    commit = git_output(comfy_root, "rev-parse", "--short", "HEAD") if (comfy_root / ".git").exists() else None
    version = literal_assignments(comfy_root / "comfyui_version.py", ("__version__",)).get("__version__")
    if isinstance(version, str):
        return version, "comfyui_version.py", commit
    try:
        project = tomllib.loads((comfy_root / "pyproject.toml").read_text(encoding="utf-8"))
        version = project.get("project", {}).get("version")
        if isinstance(version, str):
            return version, "pyproject.toml", commit
    except (OSError, tomllib.TOMLDecodeError):
        pass
    if commit:
        tag = git_output(comfy_root, "describe", "--tags", "--exact-match", "HEAD")
        if tag and re.fullmatch(r"v?\d+(\.\d+)*", tag):
            return tag.lstrip("v"), "git tag", commit
        return None, "git commit", commit
    return None, "unknown", None


def git_output(folder: Path, *args: str) -> str | None:
    if shutil.which("git") is None:
        return None
    try:
        proc = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def torch_versions(site_packages: Path | None) -> tuple[str | None, str | None]:
    """(__version__ with its local label, CUDA version) from torch/version.py; METADATA when it is absent."""
    if site_packages is None:
        return None, None
    found = literal_assignments(site_packages / "torch" / "version.py", ("__version__", "cuda"))
    version = found.get("__version__")
    cuda = found.get("cuda")
    if not isinstance(version, str):
        version = dist_version(site_packages, "torch")
    return version, cuda if isinstance(cuda, str) else None


def dist_version(site_packages: Path, name: str) -> str | None:
    prefix = name.replace("-", "_").lower() + "-"
    try:
        entries = list(site_packages.iterdir())
    except OSError:
        return None
    for entry in sorted(entries):
        if entry.name.lower().startswith(prefix) and entry.name.endswith(".dist-info"):
            try:
                for line in (entry / "METADATA").read_text(encoding="utf-8", errors="replace").splitlines():
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
                    if not line.strip():
                        break
            except OSError:
                continue
    return None


def triton_version(site_packages: Path | None) -> str | None:
    if site_packages is None:
        return None
    return dist_version(site_packages, "triton") or dist_version(site_packages, "triton-windows")


def detect_gpus() -> list[GPU]:
    """GPUs from nvidia-smi when present (short timeout); an empty list otherwise."""
    smi = shutil.which("nvidia-smi")
    if smi is None or os.environ.get("APPLIER_NO_GPU_PROBE") == "1":
        return []
    try:
        proc = subprocess.run([smi, "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0]:
            memory = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None
            gpus.append(GPU(parts[0], parts[1] or None, memory))
    return gpus
