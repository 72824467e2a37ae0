"""The overlay's variants checked against real ComfyUI trees of several eras (and recorded into variants.json).

For each tree (a folder of ComfyUI's code, e.g. an extracted release; never committed):
1. `applier overlay check`'s logic (static, no torch): which variant each model family and op family would run;
2. where this machine's torch can import the tree's model modules, the run-time recognition: tiny Flux and Wan
   blocks built by the tree's own classes (its `comfy.ops`), fingerprinted through the live objects
   (fused_dit.integration.eras) - the two must agree - and, with the overlays enabled, the output compared with the
   tree's stock forward and ComfyUI's attention-patch hook (`attn1_patch`) checked to still fire. Run in a child
   process per tree (a clean `sys.modules`); modules unrelated to the model code that the tree imports and this
   machine lacks are stubbed, and the JSON lists them.

    python -m benchmarks validate overlay-eras --tree 0.3.64=DIR --tree 0.33.0=DIR ... \\
        --out benchmarks/results/overlay-eras.json
    python -m benchmarks validate overlay-eras --record 0.3.64=DIR   # write that release's fingerprints into
                                                                     # overlays/fused_dit/variants.json
    python -m benchmarks validate overlay-eras --gpu-rope GPU.json   # on a CUDA device with comfy-kitchen: the
                                                                     # RoPE seam against it (bits, ulp, ms);
                                                                     # --with-gpu GPU.json puts it into --out
`--record` fills only the variants whose verified_on already lists the release: verifying a variant on a release
is a decision made in variants.json, the script only takes the hashes.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from applier.pack import check as overlay_check

from .results import write_json

# levels of overlay-eras.json written one member per line: down to each variant's verdict and code (per tree, model
# and family); what is below stays on one line
ERAS_EXPANDED_DEPTH = 5

REPO = Path(__file__).resolve().parents[1]
DEPS = REPO / ".cache" / "eras-deps"      # comfy-kitchen and friends for the child (pip --target), never committed

VARIANTS_JSON = REPO / "overlays" / "fused_dit" / "variants.json"
RECORD_FROM = {"flux_block_forward_0.3": "Flux", "wan_block_forward_0.3": "Wan 2.1"}


def static_prints(report: dict) -> dict[str, dict[str, str | None]]:
    """{variant: {dependency key: sha256}} as the check found them (Flux's and Wan 2.1's blocks, the Linear op)."""
    prints = {name: {k: v["sha256"] for k, v in seam["code"].items()} for name, seam in report["seams"].items()}
    for model in report["models"]:
        for name, variant in model.get("variants", {}).items():
            if RECORD_FROM.get(name) == model["model"]:
                prints[name] = {k: v["sha256"] for k, v in variant["code"].items()}
    return prints


def compare_prints(static: dict, live: dict) -> dict:
    """Per variant, the dependency keys whose run-time fingerprint equals the check's ("same"), differs ("differ"),
    or exists only at run time because the files bind the name otherwise than by one def ("only_at_run_time", e.g.
    0.8.0's `apply_rope = comfy.quant_ops.ck.apply_rope`, a comfy-kitchen function at run time)."""
    out = {}
    for name, found in live.items():
        rows = {"same": [], "differ": [], "only_at_run_time": []}
        for key, value in found.items():
            expected = static.get(name, {}).get(key)
            rows["same" if value == expected else "only_at_run_time" if expected is None else "differ"].append(key)
        out[name] = rows
    return out


def record(version: str, tree: Path) -> list[str]:
    data = json.loads(VARIANTS_JSON.read_text())
    prints = static_prints(overlay_check.check_tree(tree, version))
    filled = []
    for name, spec in data["variants"].items():
        if version in spec["verified_on"]:
            if any(v is None for v in prints[name].values()):
                raise SystemExit(f"{name}: code it depends on is not resolvable in {tree}: {prints[name]}")
            spec["verified_on"][version] = prints[name]
            filled.append(name)
    VARIANTS_JSON.write_text(json.dumps(data, indent=2) + "\n")
    return filled


# modules a tree's model files import (through comfy.ldm.util, comfy.model_management, comfy.ops ...) that have nothing
# to do with the blocks' math; stubbed in the child only when this machine cannot import them, and listed in the JSON
UNRELATED = ("PIL", "torchvision", "torchaudio", "av", "psutil", "safetensors", "yaml", "scipy", "tqdm",
             "transformers", "tokenizers", "sentencepiece", "comfy_aimdo", "aiohttp", "spandrel", "kornia",
             "pydantic", "requests", "simpleeval", "blake3", "alembic", "sqlalchemy", "filelock")


def _install_stubs(stubbed: list[str]) -> None:
    """A meta-path finder that answers imports of UNRELATED modules missing here with permissive stand-ins."""
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import types

    class Anything(types.ModuleType):
        __path__: list = []

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: None})

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            root = name.split(".")[0]
            if root not in UNRELATED:
                return None
            if root not in stubbed:
                sys.meta_path.remove(self)
                try:
                    if importlib.util.find_spec(root) is not None:
                        return None
                finally:
                    sys.meta_path.insert(0, self)
                stubbed.append(root)
            return importlib.machinery.ModuleSpec(name, self, is_package=True)

        def create_module(self, spec):
            return Anything(spec.name)

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())


def _randomised(module, seed: int):
    import torch
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            values = torch.randn(p.shape, generator=generator)
            p.copy_(values / p.shape[-1] ** 0.5 if p.ndim > 1 else (1 + 0.1 * values if "norm" in name else
                                                                      0.02 * values))
    return module


def _tiny_models(version: str):
    """(flux-like stack, its call, wan block stack, its call), built by the tree's own classes and comfy.ops."""
    import torch
    import comfy.ldm.flux.layers as layers
    import comfy.ldm.flux.math as flux_math
    import comfy.ldm.wan.model as wan
    import comfy.ops
    from packaging.version import Version

    ops = comfy.ops.disable_weight_init
    hidden, heads, txt_len, img_len = 64, 4, 8, 24
    flux = torch.nn.Module()
    flux.double_blocks = torch.nn.ModuleList([layers.DoubleStreamBlock(hidden, heads, 4.0, qkv_bias=True,
                                                                       operations=ops)])
    flux.single_blocks = torch.nn.ModuleList([layers.SingleStreamBlock(hidden, heads, 4.0, operations=ops)])
    wan_model = torch.nn.Module()
    wan_model.blocks = torch.nn.ModuleList([wan.WanAttentionBlock(
        "t2v_cross_attn", hidden, 128, heads, operation_settings={"operations": ops, "device": "cpu",
                                                                   "dtype": torch.float32})])
    for model in (flux, wan_model):
        _randomised(model, 0)
        # ComfyUI 0.3.64's BaseModel leaves the model in training mode; from 0.3.65 it calls .eval()
        model.train() if Version(version) <= Version("0.3.64") else model.eval().requires_grad_(False)
    generator = torch.Generator().manual_seed(1)
    positions = torch.arange(txt_len + img_len, dtype=torch.float32)[None]
    pe = flux_math.rope(positions, hidden // heads, 10000).unsqueeze(1)
    flux_inputs = dict(img=torch.randn(2, img_len, hidden, generator=generator),
                       txt=torch.randn(2, txt_len, hidden, generator=generator),
                       vec=torch.randn(2, hidden, generator=generator), pe=pe)
    wan_inputs = dict(x=torch.randn(2, img_len, hidden, generator=generator),
                      e=0.1 * torch.randn(2, 6, hidden, generator=generator),
                      freqs=flux_math.rope(torch.arange(img_len, dtype=torch.float32)[None], hidden // heads,
                                           10000).unsqueeze(2),
                      context=torch.randn(2, txt_len, hidden, generator=generator))

    def run_flux(inputs, options):
        img, txt = flux.double_blocks[0](img=inputs["img"].clone(), txt=inputs["txt"].clone(), vec=inputs["vec"],
                                         pe=inputs["pe"], attn_mask=None, transformer_options=options)
        return flux.single_blocks[0](torch.cat((txt, img), 1), vec=inputs["vec"], pe=inputs["pe"], attn_mask=None,
                                     transformer_options=options)

    def run_wan(inputs, options):
        return wan_model.blocks[0](inputs["x"].clone(), e=inputs["e"], freqs=inputs["freqs"],
                                   context=inputs["context"], context_img_len=0, transformer_options=options)

    return (flux, flux_inputs, run_flux), (wan_model, wan_inputs, run_wan)


def _count_kernel_launches() -> dict[str, int]:
    """{op module: launches} of the overlay's Triton kernels from now on (each op module's launch_args wrapped)."""
    import collections
    from fused_dit.ops import adaln, gate_add, rms_rope, rope
    counts: dict[str, int] = collections.Counter()
    for module in (adaln, gate_add, rms_rope, rope):
        original = getattr(module.launch_args, "__wrapped__", module.launch_args)

        def counting(*args, _name=module.__name__.rsplit(".", 1)[-1], _original=original, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)
        counting.__wrapped__ = original
        module.launch_args = counting
    return counts


def _attention_seam(run, inputs) -> dict:
    """What ComfyUI's attention seam hands an `optimized_attention_override` in this tree (the attention family's
    contract: the function's name, and the comfy.ops it reaches with or without SDPA_BACKEND_PRIORITY)."""
    import torch
    from fused_dit.integration import attention
    seen = []

    def recorder(func, *args, **kwargs):
        ops_module = attention._ops_module(func)
        seen.append((getattr(func, "__name__", "?"), getattr(ops_module, "__name__", None),
                     isinstance(getattr(ops_module, attention.PRIORITY, None), list)))
        return func(*args, **kwargs)

    with torch.inference_mode():
        run(inputs, {"optimized_attention_override": recorder})
    return {"calls": len(seen), "functions": sorted({s[0] for s in seen}),
            "ops_module": sorted({str(s[1]) for s in seen}), "sdpa_priority_list": sorted({s[2] for s in seen}),
            "note": "with --cpu ComfyUI picks attention_sub_quad and comfy.ops has SDPA_BACKEND_PRIORITY only with "
                    "CUDA, so the attention family passes every call through here; it acts on attention_pytorch "
                    "with CUDA tensors"}


def runtime_child(tree: Path) -> dict:
    """In this (child) process: import the tree's model code and check the node's recognition on it."""
    import os
    os.environ.setdefault("TRITON_INTERPRET", "1")
    stubbed: list[str] = []
    _install_stubs(stubbed)
    sys.argv = ["main.py", "--cpu"]
    import comfy.options
    comfy.options.enable_args_parsing()              # as main.py does, so --cpu is read
    import comfyui_version  # noqa: F401  (ComfyUI's server imports it; the overlay's matches name the release)
    import torch
    import fused_dit
    from fused_dit.integration import model_fingerprints, recognition

    version = comfyui_version.__version__
    result = {"ran": True, "stubbed_unrelated_modules": stubbed, "fingerprints": {}, "models": {}}
    for (model, inputs, run), name in zip(_tiny_models(version), ("Flux", "Wan 2.1")):
        prints = model_fingerprints(model)
        for variant, found in prints.items():
            result["fingerprints"].setdefault(variant, {}).update(found)
        calls = []

        def attn1_patch(*args, **kwargs):
            calls.append(1)
            if args and isinstance(args[0], dict):          # Wan's self-attention patch: {"x", "q", "k", ...}
                return args[0]["x"]
            return {}

        options = {"patches": {"attn1_patch": [attn1_patch]}}
        entry = {"recognition": recognition(model, ("norm_rope", "adaln", "gate", "fp8_linear"))}
        with torch.inference_mode():
            stock = run(inputs, options)
        stock_calls = len(calls)
        entry["attn1_patch_calls_stock"] = stock_calls
        # as shipped, then with the seams that are off by default switched on
        for setting, seams_on in (("default", None), ("FUSED_DIT_SEAMS=rope_ck_seam", "rope_ck_seam")):
            os.environ.pop("FUSED_DIT_SEAMS", None)
            if seams_on:
                os.environ["FUSED_DIT_SEAMS"] = seams_on
            launched = _count_kernel_launches()
            before = len(calls)
            with torch.inference_mode():
                try:
                    report = fused_dit.enable(model, ops=("norm_rope", "adaln", "gate"))
                    overlaid, error = run(inputs, options), None
                except Exception as exc:                   # the record says what broke; nothing may
                    report, overlaid, error = {}, None, f"{type(exc).__name__}: {exc}"
                finally:
                    fused_dit.disable(model)
            run_entry = {"exception": error, "kernel_launches": dict(launched), "seams": report.get("seams"),
                         "attn1_patch_calls": len(calls) - before}
            if overlaid is not None:
                diff = (overlaid.float() - stock.float()).abs()
                run_entry.update(max_abs_diff=float(diff.max()),
                                 max_rel_diff=float(diff.max() / stock.float().abs().max()),
                                 bit_identical=bool(torch.equal(overlaid, stock)))
            entry[setting] = run_entry
        os.environ.pop("FUSED_DIT_SEAMS", None)
        entry["attention_seam"] = _attention_seam(run, inputs)
        result["models"][name] = entry
    return result


GPU_ROPE_SHAPES = {   # q or k as ComfyUI hands them to comfy-kitchen, and the table's leading dims
    "flux-1024 q [1, 24, 4608, 128]": ((1, 24, 4608, 128), (1, 1, 4608)),
    "flux-2048 q [1, 24, 16896, 128]": ((1, 24, 16896, 128), (1, 1, 16896)),
    "wan-480x832x33 q [1, 14040, 40, 128]": ((1, 14040, 40, 128), (1, 14040, 1)),
}


def gpu_rope() -> dict:
    """On a CUDA device with comfy-kitchen importable: the seam's RoPE kernel against ComfyUI's eager chain and
    comfy-kitchen's CUDA backend in bf16 (differing elements, max ulp in bf16), and their times (CUDA events)."""
    import torch
    import comfy_kitchen as ck
    from fused_dit.integration.attention import cuda_timer
    from fused_dit.ops import rope

    def ulps(a, b):
        ai, bi = (t.view(torch.int16).int() for t in (a, b))
        ai = torch.where(ai < 0, -32768 - ai, ai)
        bi = torch.where(bi < 0, -32768 - bi, bi)
        return (ai - bi).abs()

    def timed(fn):
        return cuda_timer(fn, repeats=50, warmup=5)

    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "comfy_kitchen": getattr(ck, "__version__", None), "backends": {k: str(v) for k, v in
                                                                           ck.list_backends().items()}, "shapes": {}}
    generator = torch.Generator(device="cuda").manual_seed(0)
    for name, (shape, lead) in GPU_ROPE_SHAPES.items():
        x = torch.randn(shape, device="cuda", generator=generator).bfloat16()
        positions = torch.rand(lead, device="cuda", generator=generator) * 4096
        omega = 1.0 / 10000 ** (torch.arange(0, shape[-1], 2, device="cuda", dtype=torch.float64) / shape[-1])
        angles = positions.double()[..., None] * omega
        freqs = torch.stack([angles.cos(), -angles.sin(), angles.sin(), angles.cos()], -1).reshape(
            *lead, shape[-1] // 2, 2, 2).float()
        eager = rope.reference_comfy(x, freqs)
        ours = rope.apply_rope1(x, freqs)
        entry = {"kernel_ran": rope.kernel_runs(x, freqs)}
        results = {"overlay": ours}
        for backend in ("cuda", "eager", "triton"):
            try:
                with ck.registry.use_backend(backend):
                    results[f"comfy-kitchen {backend}"] = ck.apply_rope1(x, freqs)
                    entry[f"ms comfy-kitchen {backend}"] = timed(lambda: ck.apply_rope1(x, freqs))
            except Exception as exc:
                entry[f"comfy-kitchen {backend}"] = f"not run: {type(exc).__name__}: {exc}"
        for label, value in results.items():
            diff = ulps(value, eager)
            entry[f"{label} vs eager chain"] = {"differing": int((diff > 0).sum()), "of": diff.numel(),
                                                "max_ulp": int(diff.max())}
        if "comfy-kitchen cuda" in results:
            diff = ulps(ours, results["comfy-kitchen cuda"])
            entry["overlay vs comfy-kitchen cuda"] = {"differing": int((diff > 0).sum()), "max_ulp": int(diff.max())}
        entry["ms overlay"] = timed(lambda: rope.apply_rope1(x, freqs))
        entry["ms eager chain"] = timed(lambda: rope.reference_comfy(x, freqs))
        entry["bytes"] = 2 * x.numel() * x.element_size() + freqs.numel() * 4
        out["shapes"][name] = entry
    return out


def child_json(mode: str, tree: Path, timeout: float) -> dict:
    """The last JSON line `python -m benchmarks validate MODE --runtime-child TREE` prints (each tree's ComfyUI is
    imported in a process of its own), or {"ran": False, "reason": ...}."""
    child = [sys.executable, "-m", "benchmarks", "validate", mode, "--runtime-child", str(tree)]
    try:
        done = subprocess.run(child, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"ran": False, "reason": f"timed out after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"ran": False, "reason": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-3:]}"}
    return {"ran": True, **json.loads(lines[-1])}


NODE_USES = ("clone", "add_wrapper_with_key", "remove_wrappers_with_key", "add_callback_with_key",
             "remove_callbacks_with_key", "add_object_patch")


def node_api(tree: Path) -> dict:
    """What the node calls on ComfyUI, as the tree defines it: ModelPatcher's methods, the wrapper and callback
    names, and whether attention's wrapper reads `optimized_attention_override` (read with ast, nothing imported)."""
    import ast
    patcher = ast.parse((tree / "comfy" / "model_patcher.py").read_text())
    methods = {n.name for c in patcher.body if isinstance(c, ast.ClassDef) and c.name == "ModelPatcher"
               for n in c.body if isinstance(n, ast.FunctionDef)}
    extension = (tree / "comfy" / "patcher_extension.py").read_text()
    attention_py = (tree / "comfy" / "ldm" / "modules" / "attention.py").read_text()
    return {"model_patcher_methods": {name: name in methods for name in NODE_USES},
            "apply_model_wrapper": 'APPLY_MODEL = "apply_model"' in extension,
            "on_cleanup_callback": 'ON_CLEANUP = "on_cleanup"' in extension,
            "attention_override_seam": '"optimized_attention_override" in transformer_options' in attention_py}


def summary(report: dict) -> dict:
    """{model: {op family: what runs, or why stock}} of a check report, one line each."""
    out = {}
    for model in report["models"]:
        out[model["model"]] = {family: f"runs {v['short']}" if v["runs"] else f"stock: {v['reason']}"
                               for family, v in model["families"].items()}
    return out


def add_arguments(parser) -> None:
    parser.add_argument("--tree", action="append", default=[], metavar="VERSION=DIR")
    parser.add_argument("--record", action="append", default=[], metavar="VERSION=DIR")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-runtime", action="store_true", help="only the static check")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--runtime-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--gpu-rope", type=Path, metavar="JSON",
                        help="on a CUDA device with comfy-kitchen: the RoPE seam against comfy-kitchen, into JSON")
    parser.add_argument("--with-gpu", type=Path, metavar="JSON", help="a --gpu-rope result to include in --out")


def import_paths(options) -> list[Path]:
    """A runtime child imports its tree's ComfyUI (comfy-kitchen and friends from DEPS); both import the pack."""
    if options.runtime_child:
        return [options.runtime_child.resolve(), REPO / "overlays", DEPS]
    return [REPO / "overlays"] if getattr(options, "gpu_rope", None) else []


def run(args, parser=None) -> int:
    if args.gpu_rope:
        args.gpu_rope.write_text(json.dumps(gpu_rope(), indent=1) + "\n")
        return 0
    if args.runtime_child:
        print(json.dumps(runtime_child(args.runtime_child)))
        return 0
    for item in args.record:
        version, _, folder = item.partition("=")
        print(f"{version}: recorded {', '.join(record(version, Path(folder))) or 'nothing'}")
    eras = []
    for item in args.tree:
        version, _, folder = item.partition("=")
        report = overlay_check.check_tree(Path(folder), version)
        runtime = {"ran": False, "reason": "--no-runtime"} if args.no_runtime else child_json(
            "overlay-eras", Path(folder), args.timeout)
        if runtime.get("ran"):
            runtime["fingerprints_against_check"] = compare_prints(static_prints(report), runtime["fingerprints"])
        report.pop("comfyui_root")
        eras.append({"comfyui_version": version, "summary": summary(report), "node_api": node_api(Path(folder)),
                     "check": report,
                     "runtime": runtime})
        print(json.dumps({"comfyui_version": version, "summary": eras[-1]["summary"]}, indent=1))
    if args.out and eras:
        import torch
        result = {"what": "overlay variants on real ComfyUI trees: `applier overlay check` (static) and the node's "
                          "run-time recognition, exactness and attn1_patch on tiny blocks built by each tree's "
                          "own classes (CPU, fp32)",
                  "date": time.strftime("%Y-%m-%d"), "machine": platform.machine(), "python": platform.python_version(),
                  "torch": torch.__version__, "command": "python -m benchmarks validate overlay-eras "
                  + " ".join(f"--tree {e['comfyui_version']}=DIR" for e in eras)
                  + (" --with-gpu GPU.json (from --gpu-rope GPU.json on the H200, comfy-kitchen 0.2.31 carried)"
                     if args.with_gpu else "") + " --out " + str(args.out),
                  "gpu": "none (CPU)", "eras": eras}
        if args.with_gpu:
            result["rope_seam_on_gpu"] = json.loads(args.with_gpu.read_text())
        previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
        if "model_table" in previous:          # `validate model-table`'s section of the file, kept
            result["model_table"] = previous["model_table"]
        write_json(result, args.out, expanded_depth=ERAS_EXPANDED_DEPTH)
    return 0

