"""The measuring kit's one entry point: `python -m benchmarks COMMAND ...`, from the repository root.

Each command is one module of this package with `add_arguments(parser)` and `run(options, parser) -> int`; a module
that imports code from outside the repository's packages (a ComfyUI checkout, the overlay pack in overlays/) names
those folders in `import_paths(options)`, and this module, the only one that edits sys.path, puts them in front
before the command runs. benchmarks/README.md says what each command is for and how the device scripts call them.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module, one line of what it does); a command with modes maps each mode so (`validate overlay-eras`)
COMMANDS = {
    "generation": ("generation", "whole generations through a ComfyUI release's loader and sampler, stock vs overlays"),
    "step-profile": ("step_profile", "one sampling step by kernel category, and the ceilings it leaves"),
    "attention-kernels": ("attention_kernels", "attention kernels per DiT shape: SDPA, the FP8 kernel's sweep, sage; "
                          "TFLOPS and error vs fp32"),
    "attention-projection": ("attention_projection", "attention kernels measured on one GPU projected onto another "
                             "from published peaks (a projection)"),
    "comfy-server": ("comfy_server", "the node through a real ComfyUI server: install, start, prompts over HTTP"),
    "canvas-pipeline": ("canvas_pipeline", "a 32K canvas through a real server's nodes, after applier apply and stock"),
    "tiled-route": ("tiled_route", "the tiled 32K route through a real server: TiledSampling, its peaks, the peer "
                    "side by side"),
    "tiled-vae": ("tiled_vae", "the one-pass tiled VAE against ComfyUI's tiled VAE and the untiled one, in process"),
    "compiler": ("compiler", "the node's configs under ComfyUI's model compiler (malloc graphs, CUDA graphs), on/off"),
    "assemble": ("assemble", "the newest reachable ComfyUI: a real tree plus code-index files, each checked"),
    "fp8-linear-shapes": ("fp8_linear_shapes", "FP8 Linear vs bf16 per shape; --write-table: the pack's per-call rule"),
    "checkpoint": ("models", "write the random-weight checkpoint a UNETLoader reads, for one release"),
    "validate": {
        "overlay-eras": ("eras", "overlay variants on real ComfyUI trees; --record fills variants.json"),
        "fp8-eras": ("fp8_eras", "the FP8 seam on real ComfyUI trees; --record-mixed fills variants.json"),
        "comfyui-sweep": ("sweep", "apply / status / revert over a ComfyUI mirror's history, byte-identical"),
        "node-pack": ("node_pack", "the node pack cloned as ComfyUI-Manager does into a real release, on the CPU"),
        "budget": ("budget", "applier budget's predictions against the committed H200 runs (--check: efficiencies)"),
        "model-table": ("model_table", "the pack's model table against a real ComfyUI tree's own classes and "
                        "detection, on the CPU"),
    },
    "upstream": {
        "torch": ("fetch_torch", "fill the torch upstream cache (torch/cuda files per release)"),
        "comfyui": ("fetch_comfyui", "fill the ComfyUI upstream cache from a git mirror"),
    },
    "coverage": ("coverage", "write docs/coverage.md from the upstream cache"),
    "reliability": ("reliability", "run tests/reliability and write its figures"),
    "index": ("results", "rewrite benchmarks/results/README.md (--check: exit 1 when stale)"),
}


def _module(name: str):
    return importlib.import_module(f"benchmarks.{name}")


def _add(subparsers, name: str, module_name: str, what: str) -> None:
    module = _module(module_name)
    parser = subparsers.add_parser(name, help=what, description=(module.__doc__ or what).strip(),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_arguments(parser)
    parser.set_defaults(module=module, parser=parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, target in COMMANDS.items():
        if isinstance(target, tuple):
            _add(commands, name, *target)
            continue
        group = commands.add_parser(name, help=f"modes: {', '.join(target)}")
        modes = group.add_subparsers(dest="mode", required=True, metavar="MODE")
        for mode, (module_name, what) in target.items():
            _add(modes, mode, module_name, what)
    return parser


def main(argv: list[str] | None = None) -> int:
    options = build_parser().parse_args(argv)
    paths = getattr(options.module, "import_paths", lambda _: [])(options)
    sys.path[:0] = [str(path) for path in paths]
    return options.module.run(options, options.parser) or 0


if __name__ == "__main__":
    sys.exit(main())
