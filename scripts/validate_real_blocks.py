#!/usr/bin/env python3
"""Maintainer check: the fused_dit overlays on ComfyUI's REAL Flux and Wan blocks (CPU fp32, or CUDA bf16).

The project's own tests run the overlays against fixtures written to follow ComfyUI's math
(tests/overlays/blocks.py). This script imports the real modules from a ComfyUI checkout instead
(comfy.ldm.flux.layers.DoubleStreamBlock / SingleStreamBlock with `pe` from the real EmbedND,
comfy.ldm.wan.model.WanAttentionBlock with freqs from the real WanModel.rope_encode), builds small blocks with
seeded random weights, left in training mode as ComfyUI 0.3.64 leaves Flux and Wan, runs every forward under
torch.inference_mode() as ComfyUI's executor does, and for every op family:

  1. runs the block stock (inputs cloned per run: ComfyUI's Flux blocks add into `txt` / `x` in place),
  2. `fused_dit.enable(block, ops=...)` and runs it again under TRITON_INTERPRET=1, so the Triton kernels really
     execute; the backend each op took is read from the `fused_dit` dispatch log,
  3. runs the same overlay with FUSED_DIT_BACKEND=eager (informational: how far the kernel is from the eager op),
  4. `fused_dit.disable(block)` and checks the stock forward is back: no instance `forward` attribute left and an
     output bit-identical to the first stock run.

Optionally (`--node`, on by default) it drives the pack's ComfyUI node through the real
comfy.model_patcher.ModelPatcher: FusedDiTOps.patch() on a patcher around a tiny module holding real Flux blocks,
then the APPLY_MODEL wrapper the node registered, executed through comfy.patcher_extension.WrapperExecutor.

The checkout is either given (--comfyui) or made from a bare mirror (--mirror, --rev) with `git worktree add` into
--worktree outside this repo (blobs the mirror lacks are listed, not fatal) and removed at the end unless --keep.
Nothing from ComfyUI is copied into this repo.

`--device cuda --dtype bfloat16` runs the same checks on the GPU at the dtype users run, with GPU-sized blocks
(Flux: hidden 3072, 24 heads, 512 text + 4096 image tokens; Wan: dim 5120, 40 heads, 4096 tokens; pe/freqs from
ComfyUI's own embedders), no interpreter, and adds per run: the fraction of output elements within one ulp of the
output dtype of stock, both outputs against an fp32 copy of the block (is the overlay at least as close to fp32 as
stock bf16?), fp8_linear for real (it must not decline on sm_89+), and stock-vs-overlay timings per block (CUDA
events, warm-up, interleaved, median). A checkout without .git may carry a REVISION file (commit, then date).

Example:
    python3 scripts/validate_real_blocks.py --mirror MIRROR --python VENV/bin/python \
        --out benchmarks/results/real-blocks-cpu.json        # MIRROR: a ComfyUI git mirror; VENV: its requirements
"""
from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import results_io  # noqa: E402  (stdlib only: the results' layout and path placeholders)
CHILD_MARK = "FUSED_DIT_VALIDATE_CHILD"
# fp32 end to end: the kernels and the eager chain differ only in summation order
RELATIVE_TOLERANCE = 1e-5
# bf16: stock rounds to bf16 after every op, the fused kernels once; a few bf16 ulps (2**-8) over a block
RELATIVE_TOLERANCE_BF16 = 2e-2
# FP8 e4m3 activations and weights (3 mantissa bits) in every linear of a block
RELATIVE_TOLERANCE_FP8 = 1.5e-1
# the overlay's distance to the fp32 block may exceed stock bf16's by this factor (plus FP32_DISTANCE_SLACK)
FP32_DISTANCE_FACTOR = 1.25
FP32_DISTANCE_SLACK = 1e-3
# what this process runs on; set once by validate() from --device / --dtype
RUN = {"device": "cpu", "dtype": "float32", "warmup": 5, "iterations": 25}
OP_CONFIGS = (("norm_rope",), ("adaln",), ("gate",), ("norm_rope", "adaln", "gate"), ("fp8_linear",))


# ------------------------------------------------------------------------------------------- checkout handling
def git(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def make_worktree(mirror: Path, rev: str, dest: Path) -> dict:
    """`git worktree add` of rev at dest; files whose blobs the mirror lacks are listed (they stay missing).

    A plain `worktree add` aborts on the first missing blob (the stored mirror drops large files), so the tree is
    added without checkout and written with `checkout-index`, which skips unreadable blobs and goes on."""
    if dest.exists():
        raise SystemExit(f"{dest} exists; remove it or pass --comfyui {dest}")
    added = git(f"--git-dir={mirror}", "worktree", "add", "--no-checkout", "--detach", str(dest), rev)
    if added.returncode:
        raise SystemExit(f"git worktree add failed: {added.stderr.strip()}")
    git("read-tree", "HEAD", cwd=dest)
    checkout = git("checkout-index", "-a", "-f", cwd=dest)
    missing = [line.split("file of ", 1)[1].split(" (")[0] for line in checkout.stderr.splitlines()
               if "unable to read sha1 file of" in line]
    return {"mirror": str(mirror), "rev": rev, "worktree": str(dest), "missing_blobs": missing}


def remove_worktree(mirror: Path, dest: Path) -> str:
    removed = git(f"--git-dir={mirror}", "worktree", "remove", "--force", str(dest))
    if removed.returncode:
        shutil.rmtree(dest, ignore_errors=True)
        git(f"--git-dir={mirror}", "worktree", "prune")
        return f"worktree remove failed ({removed.stderr.strip()}); deleted the folder and pruned"
    return "removed"


def describe_checkout(checkout: Path) -> dict:
    head = git("rev-parse", "HEAD", cwd=checkout).stdout.strip() if (checkout / ".git").exists() else ""
    date = git("log", "-1", "--format=%ci", cwd=checkout).stdout.strip() if head else ""
    revision = checkout / "REVISION"
    if not head and revision.exists():   # a carried export of the tree, without .git
        head, _, date = (revision.read_text().strip() + "\n").partition("\n")
        date = date.strip()
    version = None
    version_file = checkout / "comfyui_version.py"
    if version_file.exists():
        for line in version_file.read_text().splitlines():
            if line.startswith("__version__"):
                version = line.split("=", 1)[1].strip().strip("\"'")
    return {"path": str(checkout), "head": head or None, "commit_date": date or None, "comfyui_version": version}


# ------------------------------------------------------------------------------------------------ log capture
class DispatchLog(logging.Handler):
    """Collects the `fused_dit` logger's decisions: (op, backend, reason) per dispatch, plus skipped blocks."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def take(self) -> list[logging.LogRecord]:
        taken, self.records = self.records, []
        return taken


def forget_said_decisions() -> None:
    """The dispatcher logs each decision once per process; forget them so every case logs its own."""
    from fused_dit import dispatch, ops
    dispatch._said.clear()
    ops._fallbacks_said.clear()
    from fused_dit.ops import quantize_fp8
    getattr(quantize_fp8, "_fp8_choices", {}).clear()


def backends_from(records: list[logging.LogRecord]) -> tuple[dict, list[str]]:
    """op -> {"backend", "reason"} (a Triton choice followed by an eager fallback counts as eager) and all lines."""
    backends: dict[str, dict] = {}
    lines = []
    for record in records:
        lines.append(record.getMessage())
        args = record.args if isinstance(record.args, tuple) else ()
        if record.msg == "fused_dit: %s -> %s (%s)" and len(args) == 3:
            op, backend, reason = args
            entry = backends.setdefault(op, {"backend": backend, "reason": reason, "decisions": []})
            entry["decisions"].append(f"{backend} ({reason})")
            if backend != entry["backend"]:
                entry["backend"] = "mixed"
        elif record.msg == "fused_dit: %s -> eager (%s)" and len(args) == 2:
            op, reason = args
            entry = backends.setdefault(op, {"backend": "eager", "reason": reason, "decisions": []})
            entry["decisions"].append(f"eager fallback after dispatch ({reason})")
            entry["backend"], entry["reason"] = "eager", f"fallback: {reason}"
    return backends, lines


# ------------------------------------------------------------------------------------------------- comparison
def ulp_of(values, dtype):
    """One unit in the last place of `dtype` at each of `values` (float64 in, float64 out); zeros get the
    smallest subnormal, so only an exact zero is 'within one ulp' of a zero."""
    import torch
    info = torch.finfo(dtype)
    _, exponent = torch.frexp(values.abs())
    # |v| = m * 2**exponent with m in [0.5, 1); eps = 2**-(mantissa bits) is the ulp at 1.0
    ulp = info.eps * torch.pow(2.0, (exponent - 1).double())
    return torch.where(values == 0, torch.full_like(ulp, info.smallest_normal * info.eps), ulp)


def compare(result, reference) -> dict:
    """Worst max-abs and relative Frobenius over the output tensors, bit identity, and the fraction of elements
    within one ulp (of the result's dtype) of the reference."""
    import torch
    pairs = list(zip(result, reference)) if isinstance(result, tuple) else [(result, reference)]
    worst_abs, worst_rel, identical, within, total = 0.0, 0.0, True, 0, 0
    for got, want in pairs:
        dtype = got.dtype
        got, want = got.detach().double(), want.detach().double()
        identical = identical and torch.equal(got, want)
        difference = (got - want).abs()
        worst_abs = max(worst_abs, difference.max().item())
        worst_rel = max(worst_rel, ((got - want).norm() / want.norm().clamp_min(1e-30)).item())
        if dtype.is_floating_point:
            within += int((difference <= ulp_of(want, dtype)).sum().item())
            total += difference.numel()
    return {"max_abs": worst_abs, "rel_frobenius": worst_rel, "bit_identical": identical,
            "within_1ulp_fraction": within / total if total else None}


def run_device():
    import torch
    return torch.device(RUN["device"])


def run_dtype():
    import torch
    return getattr(torch, RUN["dtype"])


def on_gpu() -> bool:
    return RUN["device"] == "cuda"


def relative_tolerance() -> float:
    return RELATIVE_TOLERANCE if RUN["dtype"] == "float32" else RELATIVE_TOLERANCE_BF16


def to_run(module):
    """Module on the run's device, weights seeded there (fp32 draws), then cast to the run's dtype."""
    return module.to(run_device())


def cast_inputs(inputs: dict, keep_fp32=("pe", "freqs", "timestep")) -> dict:
    """Floating inputs to the run's dtype on its device; rope tables stay fp32 as ComfyUI's embedders return them."""
    import torch
    out = {}
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor):
            value = value.to(run_device())
            if value.is_floating_point() and key not in keep_fp32:
                value = value.to(run_dtype())
        out[key] = value
    return out


def clone_inputs(inputs: dict) -> dict:
    import torch
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def run_block(block, inputs: dict):
    import torch
    with torch.inference_mode():
        out = block(**clone_inputs(inputs))
    return tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone()


def instance_forwards(model) -> int:
    return sum(1 for m in model.modules() if "forward" in m.__dict__)


# ----------------------------------------------------------------------------------------------- block builders
def seeded_weights(module, seed: int) -> None:
    """Random weights with sane scales (comfy.ops leave them uninitialised): Linear ~ 1/sqrt(fan_in), norm weights
    near 1, biases and modulation tables small."""
    import torch
    device = next(module.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float32, device=device)
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith("modulation") or name == "modulation":
                parameter.copy_(0.1 * noise)
            elif parameter.dim() >= 2:
                parameter.copy_(noise / parameter.shape[-1] ** 0.5)
            elif leaf in ("scale", "weight"):
                parameter.copy_(1.0 + 0.1 * noise)
            else:
                parameter.copy_(0.05 * noise)
    module.to(run_dtype())


def flux_cases(seed: int) -> list[dict]:
    import torch
    import comfy.ops
    from comfy.ldm.flux import layers

    if on_gpu():   # Flux dev/schnell block width; 512 T5 tokens + a 1024x1024 image's 64x64 patches
        hidden, heads, batch, txt_len, grid_h, grid_w, axes_dim = 3072, 24, 1, 512, 64, 64, [16, 56, 56]
    else:          # Flux proper uses axes_dim [16, 56, 56] for head_dim 128; the same split at head_dim 64
        hidden, heads, batch, txt_len, grid_h, grid_w, axes_dim = 256, 4, 2, 8, 4, 6, [16, 24, 24]
    head_dim = hidden // heads
    embed = layers.EmbedND(dim=head_dim, theta=10000, axes_dim=axes_dim)
    # ids in the activation dtype on its device, as Flux.forward builds them; EmbedND returns fp32
    img_ids = torch.zeros(grid_h, grid_w, 3)
    img_ids[..., 1] = torch.arange(grid_h)[:, None]
    img_ids[..., 2] = torch.arange(grid_w)[None, :]
    img_ids = img_ids.reshape(1, -1, 3).repeat(batch, 1, 1).to(run_device(), run_dtype())
    txt_ids = torch.zeros(batch, txt_len, 3, device=run_device(), dtype=run_dtype())
    generator = torch.Generator().manual_seed(seed + 1)
    img, txt, vec = cast_inputs({
        "img": torch.randn(batch, grid_h * grid_w, hidden, generator=generator),
        "txt": torch.randn(batch, txt_len, hidden, generator=generator),
        "vec": torch.randn(batch, hidden, generator=generator)}).values()
    ops = comfy.ops.disable_weight_init

    cases = []
    for flipped in (False, True):
        block = layers.DoubleStreamBlock(hidden, heads, mlp_ratio=4.0, qkv_bias=True, flipped_img_txt=flipped,
                                         operations=ops)
        seeded_weights(to_run(block), seed + 10 + flipped)
        ids = torch.cat((img_ids, txt_ids), 1) if flipped else torch.cat((txt_ids, img_ids), 1)
        cases.append({"name": f"flux_double{'_flipped' if flipped else ''}", "block": block,
                      "inputs": {"img": img, "txt": txt, "vec": vec, "pe": embed(ids)},
                      "shapes": {"img": list(img.shape), "txt": list(txt.shape), "pe": list(embed(ids).shape)}})
    single = layers.SingleStreamBlock(hidden, heads, mlp_ratio=4.0, operations=ops)
    seeded_weights(to_run(single), seed + 20)
    x = torch.cat((txt, img), 1)
    pe = embed(torch.cat((txt_ids, img_ids), 1))
    cases.append({"name": "flux_single", "block": single, "inputs": {"x": x, "vec": vec, "pe": pe},
                  "shapes": {"x": list(x.shape), "pe": list(pe.shape)}})
    return cases


def wan_cases(seed: int) -> list[dict]:
    import types

    import torch
    import comfy.ops
    from comfy.ldm.flux.layers import EmbedND
    from comfy.ldm.wan import model as wan

    if on_gpu():   # Wan 2.1/2.2 14B block width; 4 latent frames of 64x64 -> 4096 tokens, 512 text tokens
        dim, ffn_dim, heads, batch, text_len, image_len = 5120, 13824, 40, 1, 512, 257
        latent_t, latent_h, latent_w = 4, 64, 64
    else:
        dim, ffn_dim, heads, batch, text_len, image_len = 256, 512, 4, 2, 12, 4
        latent_t, latent_h, latent_w = 2, 4, 8
    head_dim = dim // heads
    patch_size = (1, 2, 2)
    # WanModel.__init__'s rope embedder for this head dim; rope_encode is called unbound on a stand-in holding only
    # the two attributes it reads, so freqs come from ComfyUI's own code without building a whole WanModel
    rope_owner = types.SimpleNamespace(
        patch_size=patch_size,
        rope_embedder=EmbedND(dim=head_dim, theta=10000.0,
                              axes_dim=[head_dim - 4 * (head_dim // 6), 2 * (head_dim // 6), 2 * (head_dim // 6)]))
    # WanModel passes device=x.device, dtype=x.dtype; the embedder returns fp32
    freqs = wan.WanModel.rope_encode(rope_owner, latent_t, latent_h, latent_w, device=run_device(),
                                     dtype=run_dtype())
    tokens = latent_t * (latent_h // 2) * (latent_w // 2)
    generator = torch.Generator().manual_seed(seed + 2)
    # Wan 2.2-style per-frame modulation e_per_frame: [B, frames, 6, C], expanded over tokens by repeat_e
    x, e, e_per_frame, context, context_i2v = cast_inputs({
        "x": torch.randn(batch, tokens, dim, generator=generator),
        "e": 0.1 * torch.randn(batch, 6, dim, generator=generator),
        "e_per_frame": 0.1 * torch.randn(batch, latent_t, 6, dim, generator=generator),
        "context": torch.randn(batch, text_len, dim, generator=generator),
        "context_i2v": torch.randn(batch, image_len + text_len, dim, generator=generator)}).values()
    settings = {"operations": comfy.ops.disable_weight_init, "device": None, "dtype": None}

    cases = []
    for name, cross, cross_norm, inputs in (
            ("wan_t2v", "t2v_cross_attn", False, {"x": x, "e": e, "freqs": freqs, "context": context}),
            ("wan_t2v_per_frame_e", "t2v_cross_attn", True,
             {"x": x, "e": e_per_frame, "freqs": freqs, "context": context}),
            ("wan_i2v", "i2v_cross_attn", False,
             {"x": x, "e": e, "freqs": freqs, "context": context_i2v, "context_img_len": image_len})):
        block = wan.WanAttentionBlock(cross, dim, ffn_dim, heads, cross_attn_norm=cross_norm,
                                      operation_settings=settings)
        seeded_weights(to_run(block), seed + 30 + len(cases))
        cases.append({"name": name, "block": block, "inputs": inputs,
                      "shapes": {k: list(v.shape) for k, v in inputs.items() if isinstance(v, torch.Tensor)}})
    return cases


def model_cases(seed: int) -> list[dict]:
    """Whole real diffusion models (a few blocks each) through their own forward: enable() walks the model."""
    import torch
    import comfy.ops
    from comfy.ldm.flux.model import Flux
    from comfy.ldm.wan.model import WanModel

    ops = comfy.ops.disable_weight_init
    generator = torch.Generator().manual_seed(seed + 3)
    flux = Flux(operations=ops, in_channels=4, out_channels=4, vec_in_dim=32, context_in_dim=64, hidden_size=256,
                mlp_ratio=4.0, num_heads=4, depth=1, depth_single_blocks=2, axes_dim=[16, 24, 24], theta=10000,
                patch_size=2, qkv_bias=True, guidance_embed=False)
    seeded_weights(to_run(flux), seed + 40)
    flux_inputs = {"x": torch.randn(1, 4, 8, 12, generator=generator), "timestep": torch.tensor([0.7]),
                   "context": torch.randn(1, 8, 64, generator=generator),
                   "y": torch.randn(1, 32, generator=generator)}
    flux_inputs = cast_inputs(flux_inputs)
    wan = WanModel(model_type="t2v", patch_size=(1, 2, 2), text_len=8, in_dim=4, dim=256, ffn_dim=512, freq_dim=64,
                   text_dim=64, out_dim=4, num_heads=4, num_layers=2, operations=ops)
    seeded_weights(to_run(wan), seed + 50)
    # WanModel builds patch_embedding with dtype=torch.float32 and runs it on x.float(), whatever the model dtype
    wan.patch_embedding.float()
    wan_inputs = cast_inputs({"x": torch.randn(1, 4, 2, 8, 8, generator=generator),
                              "timestep": torch.tensor([0.7]), "context": torch.randn(1, 8, 64, generator=generator)})
    return [
        {"name": "flux_model", "block": flux, "inputs": flux_inputs, "expected_blocks": 3, "fp8_bf16": False,
         "shapes": {k: list(v.shape) for k, v in flux_inputs.items()}},
        {"name": "wan_model", "block": wan, "inputs": wan_inputs, "expected_blocks": 2, "fp8_bf16": False,
         "shapes": {k: list(v.shape) for k, v in wan_inputs.items()}},
    ]


# --------------------------------------------------------------------------------------------------- one case
def validate_case(case: dict, log: DispatchLog) -> dict:
    import inspect

    import fused_dit

    block, inputs = case["block"], case["inputs"]
    cls = type(block)
    result = {"case": case["name"], "class": f"{cls.__module__}.{cls.__qualname__}",
              "module_file": inspect.getsourcefile(cls), "forward_parameters":
              list(inspect.signature(cls.forward).parameters)[1:], "input_shapes": case["shapes"], "runs": []}
    stock = run_block(block, inputs)
    result["stock_repeat_bit_identical"] = compare(run_block(block, inputs), stock)["bit_identical"]
    fp32_reference = None
    if RUN["dtype"] != "float32":
        # the same weights and inputs in fp32: which of stock and overlay is nearer the unrounded block
        fp32_reference = fp32_output(block, inputs)
        result["stock_vs_fp32"] = compare(stock, fp32_reference)

    for ops in run_configs():
        run = {"ops": list(ops)}
        forget_said_decisions()
        log.take()
        try:
            report = fused_dit.enable(block, ops=ops)
            run["enable_report"] = report
            run["recognised"] = report["blocks"] == case.get("expected_blocks", 1) and not report["skipped"]
            run["instance_forwards_after_enable"] = instance_forwards(block)
            overlay = run_block(block, inputs)
            run["backends"], run["log"] = backends_from(log.take())
            run["vs_stock"] = compare(overlay, stock)
            if fp32_reference is not None:
                run["vs_fp32"] = compare(overlay, fp32_reference)
                run["stock_vs_fp32_rel_frobenius"] = result["stock_vs_fp32"]["rel_frobenius"]

            os.environ["FUSED_DIT_BACKEND"] = "eager"
            try:
                eager_overlay = run_block(block, inputs)
            finally:
                del os.environ["FUSED_DIT_BACKEND"]
            log.take()
            run["eager_overlay_vs_stock"] = compare(eager_overlay, stock)
            run["triton_vs_eager_overlay"] = compare(overlay, eager_overlay)
        except Exception as exc:  # a failure of one op family is a finding; the others still run
            run["error"] = f"{type(exc).__name__}: {exc}"
            run["traceback"] = traceback.format_exc(limit=8)
            run["log"] = backends_from(log.take())[1]
        finally:
            run["restored"] = fused_dit.disable(block)
        run["instance_forwards_after_disable"] = instance_forwards(block)
        run["stock_after_disable"] = compare(run_block(block, inputs), stock)
        run["verdict"] = verdict(run, ops)
        if not run.get("fp32_distance", {}).get("within_rule", True):
            print(f"    note {'+'.join(ops)}: overlay further from fp32 than stock: {run['fp32_distance']}", flush=True)
        result["runs"].append(run)
    if on_gpu():
        result["timing"] = time_case(block, inputs, log)
    if case.get("fp8_bf16", True) and RUN["dtype"] == "float32":
        result["fp8_linear_bf16"] = fp8_linear_in_bf16(block, inputs, log)
    result["pass"] = (result["stock_repeat_bit_identical"] and all(r["verdict"] == "pass" for r in result["runs"])
                      and result.get("fp8_linear_bf16", {}).get("pass", True))
    return result


def run_configs() -> tuple[tuple[str, ...], ...]:
    """The op configurations checked; on the GPU also everything at once, FP8 linears included."""
    if on_gpu():
        return OP_CONFIGS + (("norm_rope", "adaln", "gate", "fp8_linear"),)
    return OP_CONFIGS


def fp32_output(block, inputs: dict):
    import copy

    import torch
    reference = copy.deepcopy(block).float()
    fp32_inputs = {k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
                   for k, v in inputs.items()}
    output = run_block(reference, fp32_inputs)
    del reference
    return output


def time_case(block, inputs: dict, log: DispatchLog) -> dict:
    """Stock vs overlay forward time per op configuration: CUDA events around each forward, stock and overlay
    interleaved (alternating which goes first) on two copies of the block, after warm-up; medians in ms."""
    import copy
    import statistics

    import torch
    import fused_dit

    overlay_block = copy.deepcopy(block)
    timings = {"warmup": RUN["warmup"], "iterations": RUN["iterations"], "unit": "ms", "configs": []}
    for ops in run_configs():
        entry = {"ops": list(ops)}
        try:
            fused_dit.enable(overlay_block, ops=ops)
            samples = {"stock": [], "overlay": []}
            variants = {"stock": block, "overlay": overlay_block}
            with torch.inference_mode():
                for iteration in range(RUN["warmup"] + RUN["iterations"]):
                    order = ("stock", "overlay") if iteration % 2 == 0 else ("overlay", "stock")
                    events = []
                    for name in order:
                        fresh = clone_inputs(inputs)   # the Flux blocks add into their inputs in place
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        variants[name](**fresh)
                        end.record()
                        events.append((name, start, end))
                    torch.cuda.synchronize()
                    if iteration >= RUN["warmup"]:
                        for name, start, end in events:
                            samples[name].append(start.elapsed_time(end))
            for name, values in samples.items():
                entry[f"{name}_median_ms"] = statistics.median(values)
                entry[f"{name}_min_ms"] = min(values)
                entry[f"{name}_max_ms"] = max(values)
            entry["speedup"] = entry["stock_median_ms"] / entry["overlay_median_ms"]
        except Exception as exc:
            entry.update({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=8)})
        finally:
            fused_dit.disable(overlay_block)
            log.take()
        timings["configs"].append(entry)
    del overlay_block
    torch.cuda.empty_cache()
    return timings


def fp8_linear_in_bf16(block, inputs: dict, log: DispatchLog) -> dict:
    """fp8_linear on a bf16 copy: in fp32 it declines for the dtype before reaching its device check, so this
    records why it declines on CPU for the dtypes it serves (rope tables stay fp32, as ComfyUI passes them)."""
    import copy

    import torch
    import fused_dit

    bf16_block = copy.deepcopy(block).to(torch.bfloat16)
    bf16_inputs = {k: (v.to(torch.bfloat16) if isinstance(v, torch.Tensor) and k not in ("pe", "freqs") else v)
                   for k, v in inputs.items()}
    stock = run_block(bf16_block, bf16_inputs)
    forget_said_decisions()
    log.take()
    result = {"ops": ["fp8_linear"], "dtype": "bfloat16"}
    try:
        result["enable_report"] = fused_dit.enable(bf16_block, ops=("fp8_linear",))
        overlay = run_block(bf16_block, bf16_inputs)
        result["backends"], result["log"] = backends_from(log.take())
        result["vs_stock"] = compare(overlay, stock)
    except Exception as exc:
        result.update({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=8)})
    finally:
        fused_dit.disable(bf16_block)
    result["stock_after_disable"] = compare(run_block(bf16_block, bf16_inputs), stock)
    # declining means the stock forward ran: the output must be the stock output exactly
    result["pass"] = ("error" not in result and result["vs_stock"]["bit_identical"]
                      and result["stock_after_disable"]["bit_identical"])
    return result


def verdict(run: dict, ops: tuple[str, ...]) -> str:
    """pass, or what failed, in words."""
    problems = []
    if "error" in run:
        problems.append(run["error"])
    if not run.get("recognised"):
        problems.append(f"not recognised: {run.get('enable_report', {}).get('skipped')}")
    fp8_for_real = "fp8_linear" in ops and on_gpu() and RUN["dtype"] in ("bfloat16", "float16")
    tolerance = RELATIVE_TOLERANCE_FP8 if fp8_for_real else relative_tolerance()
    if "vs_stock" in run and run["vs_stock"]["rel_frobenius"] > tolerance:
        problems.append(f"rel_frobenius {run['vs_stock']['rel_frobenius']:.3g} > {tolerance}")
    if "vs_fp32" in run:
        # informational, not part of the verdict: is the overlay about as close to the fp32 block as stock is?
        limit = FP32_DISTANCE_FACTOR * run["stock_vs_fp32_rel_frobenius"] + FP32_DISTANCE_SLACK
        run["fp32_distance"] = {"overlay": run["vs_fp32"]["rel_frobenius"],
                                "stock": run["stock_vs_fp32_rel_frobenius"],
                                "ratio": run["vs_fp32"]["rel_frobenius"] / max(run["stock_vs_fp32_rel_frobenius"],
                                                                               1e-30),
                                "within_rule": run["vs_fp32"]["rel_frobenius"] <= limit}
    if fp8_for_real:
        # on sm_89+ with bf16 activations the FP8 linears must really run (a decline is logged as eager)
        non_triton = {op: f"{b['backend']} ({b['reason']})" for op, b in run.get("backends", {}).items()
                      if b["backend"] != "triton"}
        if non_triton or not run.get("backends"):
            problems.append(f"not all on triton: {non_triton or 'no dispatch logged'}")
        if not run.get("enable_report", {}).get("fp8_linears"):
            problems.append("no FP8 linear installed")
    elif ops != ("fp8_linear",):
        # every fused op of the family must have taken the Triton path (the reason the interpreter runs at all)
        non_triton = {op: b["backend"] for op, b in run.get("backends", {}).items() if b["backend"] != "triton"}
        if non_triton or not run.get("backends"):
            problems.append(f"not all on triton: {non_triton or 'no dispatch logged'}")
    elif run.get("vs_stock") and not run["vs_stock"]["bit_identical"]:
        problems.append("fp8_linear declined on CPU but the output is not the stock output")
    if not run["stock_after_disable"]["bit_identical"]:
        problems.append("stock output not bit-identical after disable")
    if run["instance_forwards_after_disable"]:
        problems.append(f"{run['instance_forwards_after_disable']} instance forward attributes left after disable")
    return "pass" if not problems else "; ".join(problems)


# ------------------------------------------------------------------------------------------- the node's path
def validate_node(seed: int, log: DispatchLog) -> dict:
    """FusedDiTOps.patch() on a real ModelPatcher; the APPLY_MODEL wrapper run through ComfyUI's WrapperExecutor."""
    import torch
    import comfy.model_patcher
    import comfy.patcher_extension as extension
    from comfy_fused_dit_node import FusedDiTOps, WRAPPER_KEY

    cases = flux_cases(seed)
    double, single = cases[0], cases[2]

    class TinyFluxDiffusionModel(torch.nn.Module):
        """A diffusion model with one real double and one real single block (only what the overlay walks)."""

        def __init__(self):
            super().__init__()
            self.double_blocks = torch.nn.ModuleList([double["block"]])
            self.single_blocks = torch.nn.ModuleList([single["block"]])

        def forward(self, img, txt, vec, pe):
            img, txt = self.double_blocks[0](img=img, txt=txt, vec=vec, pe=pe)
            return self.single_blocks[0](torch.cat((txt, img), 1), vec=vec, pe=pe)

    class TinyBaseModel(torch.nn.Module):
        """Stands in for comfy.model_base.BaseModel: the wrapper reads executor.class_obj.diffusion_model."""

        def __init__(self):
            super().__init__()
            self.diffusion_model = TinyFluxDiffusionModel()

        def apply_model(self, *args, **kwargs):
            return self.diffusion_model(*args, **kwargs)

    base = TinyBaseModel()
    inputs = double["inputs"]
    patcher = comfy.model_patcher.ModelPatcher(base, load_device=run_device(),
                                               offload_device=run_device())
    with torch.inference_mode():
        stock = base.apply_model(**clone_inputs(inputs)).clone()
    forget_said_decisions()
    log.take()
    result = {"patcher": f"{type(patcher).__module__}.{type(patcher).__name__}"}
    try:
        (patched,) = FusedDiTOps().patch(patcher, norm_rope=True, adaln=True, gate=True, fp8_linear=False)
        # what comfy.sampler_helpers does before sampling: the patcher's wrappers go into transformer_options,
        # and BaseModel.apply_model runs get_all_wrappers(APPLY_MODEL, transformer_options) through an executor
        transformer_options = {"wrappers": {}}
        extension.merge_nested_dicts(transformer_options["wrappers"], patched.wrappers, copy_dict1=False)
        wrappers = extension.get_all_wrappers(extension.WrappersMP.APPLY_MODEL, transformer_options)
        result["wrappers_on_clone"] = len(wrappers)
        result["wrappers_on_original"] = len(patcher.get_all_wrappers(extension.WrappersMP.APPLY_MODEL))
        result["wrapper_key"] = WRAPPER_KEY
        executor = extension.WrapperExecutor.new_class_executor(base.apply_model, base, wrappers)
        with torch.inference_mode():
            overlay = executor.execute(**clone_inputs(inputs)).clone()
        result["backends"], result["log"] = backends_from(log.take())
        result["vs_stock"] = compare(overlay, stock)
        result["instance_forwards_after_call"] = instance_forwards(base)
        with torch.inference_mode():
            result["stock_after_call"] = compare(base.apply_model(**clone_inputs(inputs)), stock)
        result["pass"] = (result["wrappers_on_clone"] == 1 and result["wrappers_on_original"] == 0
                          and result["vs_stock"]["rel_frobenius"] <= relative_tolerance()
                          and all(b["backend"] == "triton" for b in result["backends"].values())
                          and bool(result["backends"]) and result["instance_forwards_after_call"] == 0
                          and result["stock_after_call"]["bit_identical"])
    except Exception as exc:
        result.update({"pass": False, "error": f"{type(exc).__name__}: {exc}",
                       "traceback": traceback.format_exc(limit=8)})
    return result


# -------------------------------------------------------------------------------------------------------- main
COMFY_MODULES = ("comfy.ldm.flux.layers", "comfy.ldm.flux.model", "comfy.ldm.wan.model", "comfy.model_patcher",
                 "comfy.patcher_extension", "comfy.ops")


def import_comfy(checkout: Path) -> dict:
    """Import the ComfyUI modules the checks use (nothing stubbed) and record which third-party distributions
    that pulled in, plus which of ComfyUI's requirements.txt are not installed here (informational)."""
    import importlib
    import importlib.metadata
    import re

    before = set(sys.modules)
    record = {"modules": list(COMFY_MODULES)}
    try:
        for name in COMFY_MODULES:
            importlib.import_module(name)
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc(limit=8)
    loaded = {}
    for top in sorted({m.split(".")[0] for m in set(sys.modules) - before}):
        origin = getattr(sys.modules.get(top), "__file__", None) or ""
        if "-packages" in origin:
            try:
                loaded[top] = importlib.metadata.version(top)
            except importlib.metadata.PackageNotFoundError:
                loaded[top] = "installed (no distribution metadata under this name)"
    record["third_party_imported"] = loaded
    requirements = checkout / "requirements.txt"
    if requirements.exists():
        status = {}
        for line in requirements.read_text().splitlines():
            name = re.split(r"[<>=!~;\[ ]", line.strip(), maxsplit=1)[0]
            if not name or name.startswith("#"):
                continue
            try:
                status[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                status[name] = "missing"
        record["requirements_txt"] = status
        record["requirements_missing"] = sorted(n for n, v in status.items() if v == "missing")
    return record


def validate(checkout: Path, seed: int, node: bool) -> dict:
    if RUN["device"] == "cpu":
        # before anything imports triton: the kernels run in Triton's CPU interpreter
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    os.environ.pop("FUSED_DIT_BACKEND", None)
    sys.path[:0] = [str(checkout), str(REPO_ROOT / "overlays")]
    from comfy.cli_args import args as comfy_args
    # CPU: comfy.model_management would otherwise ask CUDA for the device
    comfy_args.cpu = RUN["device"] == "cpu"
    comfy_imports = import_comfy(checkout)

    import torch
    import fused_dit
    if "error" in comfy_imports:
        return {"environment": {"python": sys.version.split()[0], "torch": torch.__version__},
                "comfyui_imports": comfy_imports, "blocks": [], "node": None, "pass": False}

    log = DispatchLog()
    logger = logging.getLogger("fused_dit")
    logger.addHandler(log)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    torch.manual_seed(seed)

    import triton
    environment = {"python": sys.version.split()[0], "executable": sys.executable, "torch": torch.__version__,
                   "triton": triton.__version__, "fused_dit": fused_dit.__version__,
                   "fused_dit_path": str(Path(fused_dit.__file__).parent),
                   "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"),
                   "platform": platform.platform(), "dtype": RUN["dtype"], "device": RUN["device"],
                   "relative_tolerance": relative_tolerance()}
    if RUN["dtype"] != "float32":
        environment.update({"relative_tolerance_fp8": RELATIVE_TOLERANCE_FP8,
                            "fp32_distance_rule (informational)": f"overlay_vs_fp32 <= {FP32_DISTANCE_FACTOR} * stock_vs_fp32 "
                                                  f"+ {FP32_DISTANCE_SLACK}"})
    if on_gpu():
        properties = torch.cuda.get_device_properties(0)
        environment.update({"gpu": properties.name, "capability": list(torch.cuda.get_device_capability(0)),
                            "gpu_memory_gib": round(properties.total_memory / 2 ** 30, 1),
                            "cuda": torch.version.cuda, "timing": {k: RUN[k] for k in ("warmup", "iterations")}})

    blocks = []
    for builder in (flux_cases, wan_cases, model_cases):
        try:
            cases = builder(seed)
        except Exception as exc:
            blocks.append({"case": builder.__name__, "pass": False, "error": f"building failed: {exc}",
                           "traceback": traceback.format_exc(limit=8)})
            continue
        while cases:
            case = cases.pop(0)   # drop each block once checked: the GPU-sized ones are large
            started = time.monotonic()
            outcome = validate_case(case, log)
            del case
            if on_gpu():
                import torch
                torch.cuda.empty_cache()
            outcome["seconds"] = round(time.monotonic() - started, 2)
            print(f"{outcome['case']:24s} {'PASS' if outcome['pass'] else 'FAIL'}  ({outcome['seconds']} s)",
                  flush=True)
            for run in outcome["runs"]:
                if run["verdict"] != "pass":
                    print(f"    {'+'.join(run['ops'])}: {run['verdict']}", flush=True)
            if not outcome.get("fp8_linear_bf16", {}).get("pass", True):
                print(f"    fp8_linear bf16: {outcome['fp8_linear_bf16']}", flush=True)
            blocks.append(outcome)

    node_result = None
    if node:
        # the node package's folder name is not an identifier ComfyUI would import by; load it under an alias
        import importlib.util
        spec = importlib.util.spec_from_file_location(
            "comfy_fused_dit_node", REPO_ROOT / "overlays" / "comfyui_fused_dit" / "__init__.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["comfy_fused_dit_node"] = module
        spec.loader.exec_module(module)
        node_result = validate_node(seed, log)
        print(f"{'node (ModelPatcher)':24s} {'PASS' if node_result['pass'] else 'FAIL'}", flush=True)

    return {"environment": environment, "comfyui_imports": comfy_imports, "blocks": blocks, "node": node_result,
            "pass": all(b["pass"] for b in blocks) and (node_result is None or node_result["pass"])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--comfyui", type=Path, help="an existing ComfyUI checkout")
    where.add_argument("--mirror", type=Path, help="a (bare) ComfyUI git mirror to add a worktree from")
    parser.add_argument("--rev", default="HEAD", help="revision for --mirror (default HEAD)")
    parser.add_argument("--worktree", type=Path, default=Path(tempfile.gettempdir()) / "realblocks",
                        help="where --mirror checks out (default: realblocks in the temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the worktree made from --mirror")
    parser.add_argument("--python", help="interpreter with ComfyUI's requirements; the script re-runs under it")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-node", dest="node", action="store_false", help="skip the ModelPatcher/node check")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--warmup", type=int, default=RUN["warmup"], help="untimed forwards per variant (cuda)")
    parser.add_argument("--iterations", type=int, default=RUN["iterations"],
                        help="timed forwards per variant, >= 20 (cuda); the median is reported")
    parser.add_argument("--out", type=Path, required=True)
    options = parser.parse_args(argv)
    if options.iterations < 20:
        parser.error("--iterations must be at least 20")
    RUN.update(device=options.device, dtype=options.dtype, warmup=options.warmup, iterations=options.iterations)

    if options.python and not os.environ.get(CHILD_MARK):
        forwarded = [a for a in (argv if argv is not None else sys.argv[1:])]
        return subprocess.call([options.python, str(Path(__file__).resolve()), *forwarded],
                               env={**os.environ, CHILD_MARK: "1"})

    started = dt.datetime.now(dt.timezone.utc)
    worktree = None
    if options.mirror:
        worktree = make_worktree(options.mirror.resolve(), options.rev, options.worktree.resolve())
        checkout = options.worktree.resolve()
    else:
        checkout = options.comfyui.resolve()
    try:
        document = {"script": "scripts/validate_real_blocks.py", "command": results_io.command_line(),
                    "started": started.isoformat(timespec="seconds"),
                    "comfyui": {**describe_checkout(checkout), **({"worktree": worktree} if worktree else {})}}
        document.update(validate(checkout, options.seed, options.node))
    finally:
        if worktree and not options.keep:
            worktree["cleanup"] = remove_worktree(options.mirror.resolve(), checkout)
    document["seconds"] = round((dt.datetime.now(dt.timezone.utc) - started).total_seconds(), 1)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    results_io.write_json(document, options.out, "real-blocks")
    print("PASS" if document["pass"] else "FAIL")
    return 0 if document["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
