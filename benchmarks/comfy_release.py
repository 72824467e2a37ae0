"""What a ComfyUI release is to the benchmarks, and starting it the way that release's main.py does.

Read from the checkout's files, without importing it (pure, so the CPU tests cover it): the version, whether its
main.py starts DynamicVRAM (comfy-aimdo and `ModelPatcherDynamic`, since f8acd9c4, 2026-02), whether its BaseModel
calls `.eval()` (since 0.3.65) and whether Flux's `FluxParams` needs `txt_ids_dims`. `start()` then does main.py's
steps in main.py's order: the cuda_malloc import (it sets PYTORCH_CUDA_ALLOC_CONF before torch loads), comfy-aimdo's
`control.init` before torch, and after comfy.model_management is imported `control.init_devices` and
`CoreModelPatcher = ModelPatcherDynamic`, unless DynamicVRAM is disabled or unsupported (the same conditions as
main.py's). Also what a release's checkpoint looks like on disk (Flux's QK-norm keys end in `.scale` in the released
files whatever the module calls them; Comfy-Org's Qwen-Image files carry ComfyUI's `model.diffusion_model.` prefix) and
which SDPA backend a call took.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
from pathlib import Path

# Flux QK-norm parameters: the released checkpoints (BFL's flux1-dev.safetensors) name them `...norm.query_norm.scale`
# and `...norm.key_norm.scale`; ComfyUI's own RMSNorm called them `scale` too until e1add563 (0.14), torch's
# RMSNorm calls them `weight`, and ComfyUI renames `_norm.scale` to `_norm.weight` when it loads (Flux's
# process_unet_state_dict)
_FLUX_QK_NORM = re.compile(r"\.norm\.(query_norm|key_norm)\.(weight|scale)$")
# Qwen-Image: the files Comfy-Org repackaged (split_files/diffusion_models/qwen_image_bf16.safetensors and its fp8 and
# 2512 siblings) hold ComfyUI's own module names (diffusers' names: transformer_blocks.N.img_mod.1, txt_norm, img_in,
# ...) under the prefix a ComfyUI checkpoint gives its diffusion model; the loader strips it
# (model_detection.unet_prefix_from_state_dict, in load_diffusion_model_state_dict since before 0.3.64)
QWEN_IMAGE_PREFIX = "model.diffusion_model."


@dataclasses.dataclass(frozen=True)
class Release:
    """A ComfyUI checkout as its files describe it."""
    version: str | None
    commit: str | None
    commit_date: str | None
    dynamic_vram: bool            # main.py can start comfy-aimdo and ModelPatcherDynamic
    eval_in_base_model: bool      # BaseModel.__init__ calls diffusion_model.eval()
    flux_txt_ids_dims: bool       # FluxParams has a txt_ids_dims field

    def as_dict(self) -> dict:
        return {"comfyui_version": self.version, "commit": self.commit, "commit_date": self.commit_date,
                "main_py_dynamic_vram": self.dynamic_vram, "base_model_calls_eval": self.eval_in_base_model,
                "flux_txt_ids_dims": self.flux_txt_ids_dims}


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""


def class_body(source: str, name: str) -> str:
    """The text of `class NAME` up to the next top-level statement (empty when there is no such class)."""
    match = re.search(rf"^class {re.escape(name)}\b.*?$", source, re.M)
    if not match:
        return ""
    rest = source[match.end():]
    end = re.search(r"^\S", rest, re.M)
    return rest[:end.start()] if end else rest


def read_release(checkout: Path) -> Release:
    """The release a checkout holds, from comfyui_version.py, REVISION ("commit\\ndate", as exported trees carry
    it), main.py, comfy/model_base.py and comfy/ldm/flux/model.py."""
    version = None
    for line in _text(checkout / "comfyui_version.py").splitlines():
        if line.startswith("__version__"):
            version = line.split("=", 1)[1].strip().strip("\"'")
    commit, _, date = (_text(checkout / "REVISION").strip() + "\n").partition("\n")
    main = _text(checkout / "main.py")
    flux_params = class_body(_text(checkout / "comfy" / "ldm" / "flux" / "model.py"), "FluxParams")
    return Release(
        version=version, commit=commit or None, commit_date=date.strip() or None,
        dynamic_vram="ModelPatcherDynamic" in main and "comfy_aimdo" in main,
        eval_in_base_model="diffusion_model.eval()" in class_body(_text(checkout / "comfy" / "model_base.py"),
                                                                  "BaseModel"),
        flux_txt_ids_dims=bool(re.search(r"^\s+txt_ids_dims\s*:", flux_params, re.M)))


def vram_mode(release: Release, device: str, disable_dynamic: bool, torch_version: tuple) -> tuple[str, str]:
    """("dynamic" | "legacy", why), by main.py's conditions: the release has DynamicVRAM, the device is CUDA (an
    NVIDIA GPU), torch >= 2.8, and --disable-dynamic-vram was not given."""
    if not release.dynamic_vram:
        return "legacy", "this release's main.py has no DynamicVRAM"
    if disable_dynamic:
        return "legacy", "--disable-dynamic-vram"
    if device != "cuda":
        return "legacy", "DynamicVRAM needs an NVIDIA GPU"
    if tuple(torch_version[:2]) < (2, 8):
        return "legacy", "DynamicVRAM needs torch >= 2.8 (main.py falls back to the legacy ModelPatcher)"
    return "dynamic", "main.py's default on NVIDIA with torch >= 2.8"


def flux_arguments(base: dict, field_names) -> dict:
    """Flux constructor arguments for a release whose FluxParams has these fields: `txt_ids_dims` is [] for
    Flux-dev where the release requires it (model detection sets [] for Flux-dev, [3] for Flux.2)."""
    arguments = dict(base)
    if "txt_ids_dims" in field_names:
        arguments.setdefault("txt_ids_dims", [])
    return arguments


def checkpoint_key(name: str, family: str) -> str:
    """A state-dict key as the released checkpoint files spell it (Flux QK norms: `.scale`; Qwen-Image: under
    `model.diffusion_model.`; Qwen-Image 2.1's too, as ComfyUI saves a model: its own module names, gate and up
    fused, which its detection reads as fused_mlp); Wan's keys are the module's own."""
    if family in ("flux", "flux2"):
        return _FLUX_QK_NORM.sub(lambda m: f".norm.{m.group(1)}.scale", name)
    if family in ("qwen_image", "qwen_image21"):
        return name if name.startswith(QWEN_IMAGE_PREFIX) else QWEN_IMAGE_PREFIX + name
    return name


def key_format_tag(names) -> str:
    """A short stable tag of a checkpoint's key set, so files of different key formats never share a name."""
    import hashlib
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:8]


def sdpa_backend_name(index: int) -> str:
    """torch's SDPBackend index (torch._fused_sdp_choice) as a name: 0 MATH, 1 FLASH, 2 EFFICIENT, 3 CUDNN."""
    return {-1: "ERROR", 0: "MATH", 1: "FLASH_ATTENTION", 2: "EFFICIENT_ATTENTION", 3: "CUDNN_ATTENTION",
            4: "OVERRIDEABLE"}.get(int(index), f"backend {index}")


def main_backend(counts: dict) -> str | None:
    """The backend most SDPA calls took ({name: calls}); None when none was seen."""
    return max(counts, key=counts.get) if counts else None


@contextlib.contextmanager
def eager_weights():
    """ComfyUI's ops create their weights at construction while this is open (DynamicVRAM's lazy Linear and
    Embedding create none until a state dict is loaded: comfy.memory_management.aimdo_enabled)."""
    import sys
    memory = sys.modules.get("comfy.memory_management")
    previous = getattr(memory, "aimdo_enabled", None)
    if previous is None:
        yield
        return
    memory.aimdo_enabled = False
    try:
        yield
    finally:
        memory.aimdo_enabled = previous


# ------------------------------------------------------------------------------------------- main.py's start
# the ComfyUI this process imported and how it was started (import_comfyui): one per process, as in ComfyUI
STARTED: dict = {}


def import_comfyui(checkout: Path, device: str, allocator: str, disable_dynamic_vram: bool = False) -> dict:
    """Import ComfyUI the way its main.py starts it (start(): cuda_malloc, comfy-aimdo and ModelPatcherDynamic where
    the release has them; the command's import_paths put the checkout and overlays/ on sys.path); returns the
    release as its files describe it and how it was started (comfyui_version, vram_mode, ...), also kept in STARTED.

    Must run before torch is imported: main.py's cuda_malloc step sets PYTORCH_CUDA_ALLOC_CONF
    (backend:cudaMallocAsync on a supported GPU) and comfy-aimdo initialises before anything imports torch."""
    if not (checkout / "comfy" / "sd.py").exists():
        raise SystemExit(f"{checkout} is not a ComfyUI checkout (no comfy/sd.py)")
    release = read_release(checkout)
    started = start(checkout, release, device, allocator, disable_dynamic_vram)
    import comfy.sample  # noqa: F401
    import comfy.sd  # noqa: F401
    STARTED.clear()
    STARTED.update({**release.as_dict(), **started, "sdpa_priority": sdpa_priority(),
                    "comfy_kitchen": comfy_kitchen()})
    return dict(STARTED)


def sdpa_priority() -> list[str] | None:
    """The SDPA backend order ComfyUI's comfy.ops sets around its attention calls on this machine (None: none)."""
    import comfy.ops
    priority = getattr(comfy.ops, "SDPA_BACKEND_PRIORITY", None)
    return None if priority is None else [getattr(b, "name", str(b)) for b in priority]


def comfy_kitchen() -> dict | None:
    """comfy-kitchen as this ComfyUI uses it (comfy.quant_ops.ck): version and the backends it lists."""
    import sys
    quant_ops = sys.modules.get("comfy.quant_ops")
    ck = getattr(quant_ops, "ck", None) if quant_ops is not None else None
    if ck is None:
        return None
    try:
        from importlib.metadata import version
        ck_version = version("comfy-kitchen")
    except Exception:
        ck_version = getattr(ck, "__version__", None)
    try:
        backends = {str(name): {key: value for key, value in info.items() if key != "capabilities"}
                    if isinstance(info, dict) else str(info) for name, info in ck.list_backends().items()}
    except Exception as error:
        backends = {"error": f"{type(error).__name__}: {error}"}
    return {"version": ck_version, "backends": backends}



def start(checkout: Path, release: Release, device: str, allocator: str, disable_dynamic: bool) -> dict:
    """Import the checkout the way its main.py starts: returns what was done (vram_mode, why, aimdo version).

    Must run before torch is imported."""
    import importlib
    from comfy.cli_args import args
    args.cpu = device == "cpu"
    if disable_dynamic and hasattr(args, "disable_dynamic_vram"):
        args.disable_dynamic_vram = True
    if allocator == "comfy" and device != "cpu":
        import cuda_malloc  # noqa: F401  (main.py's import: it sets the allocator through the environment)
    started = {"aimdo": None}
    wants_dynamic = release.dynamic_vram and not disable_dynamic and device == "cuda"
    control = None
    if wants_dynamic:
        control = importlib.import_module("comfy_aimdo.control")
        started["aimdo"] = _aimdo_version()
        headroom = None if getattr(args, "reserve_vram", None) is None else int(args.reserve_vram * 1024 ** 3)
        try:   # main.py's protocol chain: 0.4.11+, then 0.4.10, then 0.4.9
            control.init(simple_vram_headroom=headroom, nvml_pressure=not getattr(args, "disable_nvml_pressure",
                                                                                  False))
        except TypeError:
            try:
                control.init(simple_vram_headroom=headroom)
            except TypeError:
                control.init()
    import torch
    import comfy.model_management as mm
    import comfy.model_patcher
    mode, why = vram_mode(release, device, disable_dynamic, mm.torch_version_numeric
                          if hasattr(mm, "torch_version_numeric") else _torch_version(torch.__version__))
    if mode == "dynamic":
        import comfy.memory_management
        devices = list(mm.get_all_torch_devices())
        try:
            ready = control.init_devices((d.index, int(getattr(args, "vram_headroom", 0) * 1024 ** 3))
                                         for d in devices)
        except TypeError:
            ready = control.init_devices(d.index for d in devices)
        if ready:
            # main.py then sets comfy-aimdo's log level to the console's (INFO by default); left at the library's
            # own level, aimdo calls back into Python's logging thousands of times per sampling step (9,797 per
            # Flux-dev step, about 40 ms of host time under cProfile: step-profile-0.33.0.json, host) and the
            # host-bound DynamicVRAM step runs slower than in ComfyUI
            set_level = getattr(control, "set_log_info", None)
            if set_level is not None:
                set_level()
            started["aimdo_log_level"] = "INFO" if set_level is not None else "the library's default"
            comfy.model_patcher.CoreModelPatcher = comfy.model_patcher.ModelPatcherDynamic
            comfy.memory_management.aimdo_enabled = True
        else:
            mode, why = "legacy", "comfy-aimdo did not initialise the device (main.py falls back)"
    started.update({"vram_mode": mode, "vram_mode_reason": why,
                    "core_model_patcher": getattr(comfy.model_patcher, "CoreModelPatcher",
                                                  comfy.model_patcher.ModelPatcher).__name__})
    if device == "cuda" and hasattr(mm, "set_cudnn_benchmark"):
        mm.set_cudnn_benchmark()   # start_comfyui() does this before the server runs
    return started


def _aimdo_version():
    try:
        from comfy_aimdo import _version
        return getattr(_version, "__version__", None) or getattr(_version, "version", None)
    except ImportError:
        return None


def _torch_version(text: str) -> tuple:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:2])
