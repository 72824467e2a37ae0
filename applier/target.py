"""What detection found about a target: the one record every other part reads."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class GPU:
    name: str
    compute_capability: str | None      # "8.9"
    memory_mib: int | None = None


@dataclass
class Target:
    root: Path                          # the folder --target named, resolved
    layout: str                         # "git-checkout" | "portable" | "desktop" | "plain" | "python-env"
    comfyui_root: Path | None           # the folder holding nodes.py (None for a bare python env target)
    comfyui_version: str | None         # "0.3.64"; None when unknown
    comfyui_version_source: str         # "comfyui_version.py" | "pyproject.toml" | "git tag" | "git commit" | "unknown"
    comfyui_commit: str | None
    python: Path | None                 # the target's interpreter (None: no Python env found)
    python_source: str                  # "--python" | "venv" | ".venv" | "python_embeded" | "prefix" | "state" | "none"
    python_version: str | None
    site_packages: Path | None          # where torch lives (or would live)
    torch_version: str | None           # with its local label: "2.13.0+cpu"
    torch_cuda: str | None              # "13.0"; None on CPU builds
    triton_version: str | None
    gpus: list[GPU] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # why something is missing, in words
    python_problem: str | None = None   # why `python` is not usable ("this is not a usable Python interpreter: ...")
    gpu_problem: str | None = None      # "GPU unknown: ..." when nvidia-smi hung, flooded or printed garbage
    site_packages_problem: str | None = None   # why site-packages is None although an env was found (a link out)
    purelib: Path | None = None         # the environment's own site-packages (its interpreter's sysconfig purelib):
    #                                     the overlay package's home; torch may live in a parent environment seen
    #                                     through --system-site-packages (site_packages then names that one)
    env_notes: list[str] = field(default_factory=list, repr=False)   # the notes about the Python env (replaced
    #                                                                  when detect.with_interpreter picks another)

    @property
    def python_usable(self) -> bool:
        return self.python is not None and self.python_problem is None

    @property
    def state_dir(self) -> Path:
        return self.root / ".applier"

    def component_root(self, component: str) -> Path | None:
        """The folder a catalog component's diff paths are relative to."""
        if component == "comfyui":
            return self.comfyui_root
        if component == "torch":
            return self.site_packages
        raise ValueError(f"unknown component {component!r}")

    def component_version(self, component: str) -> str | None:
        if component == "comfyui":
            return self.comfyui_version
        if component == "torch":
            return self.torch_version
        raise ValueError(f"unknown component {component!r}")

    def to_json(self) -> dict:
        data = asdict(self)
        data.pop("env_notes")
        for key, value in list(data.items()):
            if isinstance(value, Path):
                data[key] = str(value)
        data["state_dir"] = str(self.state_dir)
        return data
