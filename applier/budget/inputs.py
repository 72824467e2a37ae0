"""What the user typed, read: a canvas size, a duration, a model and a GPU named or detected, the release's range.

Every numeric input has a range covering real use (SIZE_RANGE, FRAMES_RANGE, STEPS_RANGE, CFG_RANGE, WITHIN_RANGE_S,
CPU_CORES_RANGE);
a value outside it is a ValueError that states the range, which the CLI turns into a usage error (exit 2) before
anything is priced.
"""
from __future__ import annotations

import re

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from applier.budget.records import BudgetData, Era, Gpu, Measured, Model, UnknownGpuError, UnknownModelError

# A side from 16 px (one Flux patch) to 65536 px (above the 40960 that comfyui/max-resolution allows); frames up to
# ComfyUI's video latents' own bound (length max MAX_RESOLUTION = 16384); steps and cfg as KSampler takes them.
SIZE_RANGE = (16, 65536)
FRAMES_RANGE = (1, 16384)
STEPS_RANGE = (1, 10000)            # KSampler's steps input: min 1, max 10000
CFG_RANGE = (0.0, 100.0)            # KSampler's cfg input: min 0.0, max 100.0
WITHIN_RANGE_S = (1.0, 1000 * 3600.0)
CPU_CORES_RANGE = (1, 1024)         # the host's cores for ImageScale and the PNG save

_SIZE = re.compile(r"^\s*(\d+)\s*(?:[xX*]\s*(\d+)\s*)?$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms])", re.IGNORECASE)
_UNIT_S = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


def parse_size(text: str) -> tuple[int, int]:
    """"32768x18432" -> (32768, 18432): width then height, as ComfyUI's nodes take them; "1024" is a square.
    ValueError, stating the range, otherwise."""
    match = _SIZE.match(text or "")
    if not match:
        raise ValueError(f"{text!r} is not a size: give WIDTHxHEIGHT (e.g. 32768x18432) or one side for a square")
    width = int(match.group(1))
    height = int(match.group(2)) if match.group(2) else width
    low, high = SIZE_RANGE
    if not (low <= width <= high and low <= height <= high):
        raise ValueError(f"{text!r}: each side must be from {low} to {high} pixels")
    return width, height


def parse_duration(text: str) -> float:
    """Seconds in "1h", "90m", "2h30m", "45s", "1d" or a plain number of seconds, within WITHIN_RANGE_S.
    ValueError otherwise."""
    text = (text or "").strip()
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION_PART.findall(text)
        if not parts or _DURATION_PART.sub("", text).strip():
            raise ValueError(f"{text!r} is not a duration: give e.g. 1h, 90m, 2h30m or seconds") from None
        seconds = sum(float(number) * _UNIT_S[unit.lower()] for number, unit in parts)
    low, high = WITHIN_RANGE_S
    if not low <= seconds <= high:          # False for nan as well
        raise ValueError(f"{text!r}: a duration must be from {low:g} s to {high / 3600:g} h")
    return seconds


def in_range(value: float, bounds: tuple, what: str) -> float:
    """value when within bounds (inclusive), else a ValueError stating them (nan included)."""
    low, high = bounds
    if not low <= value <= high:            # False for nan as well
        raise ValueError(f"{value} is not {what}: give a number from {low:g} to {high:g}")
    return value


def _normal(name: str) -> str:
    """A name as matched: lower case, "NVIDIA" and "GeForce" left out, separators as single spaces."""
    words = re.split(r"[\s_-]+", name.strip().lower())
    return " ".join(w for w in words if w and w not in ("nvidia", "geforce"))


def find_model(data: BudgetData, name: str) -> Model:
    wanted = _normal(name).replace(" ", "-")
    for model in data.models.values():
        if wanted == model.key or wanted in model.aliases:
            return model
    known = ", ".join(f"{m.key} ({m.name})" for m in data.models.values())
    raise UnknownModelError(f"no model family {name!r} in the budget's table", hint=f"known: {known}")


def find_gpu(data: BudgetData, name: str) -> Gpu | None:
    """The row whose key or one of whose names matches `name` (an nvidia-smi name or a short form), or None."""
    wanted = _normal(name)
    for gpu in data.gpus.values():
        if wanted in (_normal(gpu.key.replace("-", " ")), _normal(gpu.name), *(_normal(n) for n in gpu.names)):
            return gpu
    return None


def known_gpus(data: BudgetData) -> str:
    return ", ".join(f"{g.key} ({g.name})" for g in data.gpus.values())


def choose_gpu(data: BudgetData, given: str | None, detected: list[tuple[str, int | None]],
               problem: str | None = None) -> tuple[Gpu, str, int | None]:
    """(the GPU row, "--gpu" or "detected", the detected memory in MiB or None) for --gpu NAME, else for the first
    detected GPU (ComfyUI runs on cuda:0). UnknownGpuError, naming the known rows, when neither gives a row."""
    hint = f"name one with --gpu: {known_gpus(data)}"
    if given:
        gpu = find_gpu(data, given)
        if gpu is None:
            raise UnknownGpuError(f"no GPU {given!r} in the budget's table", hint=hint)
        return gpu, "--gpu", None
    if not detected:
        why = problem or "nvidia-smi found no GPU"
        raise UnknownGpuError(f"no GPU detected ({why}): the budget needs one", hint=hint)
    name, memory_mib = detected[0]
    gpu = find_gpu(data, name)
    if gpu is None:
        raise UnknownGpuError(f"the detected GPU {name!r} is not in the budget's table", hint=hint)
    return gpu, "detected", memory_mib


def era_for(measured: Measured, comfyui_version: str | None) -> tuple[Era, str]:
    """The release range whose behaviour the budget assumes, and in words why."""
    newest = measured.eras[-1]
    if not comfyui_version:
        return newest, "ComfyUI version unknown: the newest releases' behaviour assumed"
    try:
        version = Version(comfyui_version)
    except InvalidVersion:
        return newest, f"ComfyUI version {comfyui_version!r} not understood: the newest releases' behaviour assumed"
    for era in measured.eras:
        if version in SpecifierSet(era.releases):
            return era, f"ComfyUI {comfyui_version}"
    return newest, f"ComfyUI {comfyui_version} is in no known range: the newest releases' behaviour assumed"
