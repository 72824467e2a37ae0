"""applier budget: its options, read over applier/budget/inputs.py's ranges, and the report or its JSON."""
from __future__ import annotations

import sys

import click

from applier.cli.group import cli, out_json, target_options


def _budget_option(read):
    """A Click callback: the value read by `read(inputs, value)` over applier/budget/inputs.py, whose readers state
    the range they hold; outside it a usage error (exit 2) before any work. None passes (the default applies)."""
    def callback(_ctx, _param, value):
        if value is None:
            return None
        from applier.budget import inputs
        try:
            return read(inputs, value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return callback


class _TableOption(click.Option):
    """An option whose help names what the budget's tables hold (the pack's model table, the measuring host), read
    when the help is shown, not when the CLI is imported."""

    def __init__(self, *args, table_help, **kwargs):
        super().__init__(*args, **kwargs)
        self.table_help = table_help

    def get_help_record(self, ctx):
        from applier.budget.data import load_budget_data
        from applier.errors import RefusedError
        try:
            self.help = self.table_help(load_budget_data())
        except RefusedError as exc:         # a broken install: the help still shows, the command will refuse
            self.help = f"(the budget's tables cannot be read: {exc})"
        return super().get_help_record(ctx)


def _model_help(data) -> str:
    return (f"A model of the pack's model table (overlays/fused_dit/models.json): {', '.join(data.models)}; "
            "or one of its aliases.")


def _cores_help(data) -> str:
    from applier.budget.inputs import CPU_CORES_RANGE
    route = data.measured.route
    measured = f"{route.host_cores}, those of the host the route was measured on" if route else "the measuring host's"
    low, high = CPU_CORES_RANGE
    return (f"CPU cores of the machine ComfyUI runs on, for the tiled route's ImageScale and PNG save, {low}-{high} "
            f"[default: {measured}; not this machine's, as the budget often runs on another one].")


@cli.command("budget")
@target_options
@click.option("--model", "model_name", required=True, metavar="MODEL", cls=_TableOption, table_help=_model_help)
@click.option("--size", required=True, metavar="WxH", callback=_budget_option(lambda i, v: i.parse_size(v)),
              help="Canvas width x height in pixels, e.g. 32768x18432; one number is a square. Each side 16-65536.")
@click.option("--frames", type=int,
              callback=_budget_option(lambda i, v: i.in_range(v, i.FRAMES_RANGE, "a frame count")),
              help="Frames of a video model, 1-16384 [default: the model's].")
@click.option("--gpu", "gpu_name", metavar="NAME", help="A GPU of the budget's table [default: the detected one].")
@click.option("--steps", type=int,
              callback=_budget_option(lambda i, v: i.in_range(v, i.STEPS_RANGE, "a step count")),
              help="Sampling steps, 1-10000 [default: the model's reference sampler; a tiled route the template's].")
@click.option("--cfg", type=float,
              callback=_budget_option(lambda i, v: i.in_range(v, i.CFG_RANGE, "a CFG scale (KSampler's range)")),
              help="CFG scale, 0-100: 1.0 runs one forward per step, any other two [default: the model's].")
@click.option("--within", default="1h", show_default=True, metavar="DURATION",
              callback=_budget_option(lambda i, v: i.parse_duration(v)),
              help="The time a generation may take (1h, 90m, 2h30m, seconds; 1 s to 1000 h): native only if it "
                   "finishes within it.")
@click.option("--cpu-cores", "cpu_cores", type=int, metavar="N", cls=_TableOption, table_help=_cores_help,
              callback=_budget_option(lambda i, v: i.in_range(v, i.CPU_CORES_RANGE, "a core count")))
@click.option("--verbose", "-v", is_flag=True, help="Every config, every node cap and every note.")
def budget_cmd(invocation, model_name, size, frames, gpu_name, steps, cfg, within, cpu_cores, verbose):
    """What a canvas costs: the verdict and why, then time per step and generation, memory, the target's caps.

    Reads files and nvidia-smi only, never torch. Exit 2 for a value outside its range, 3 for a model or GPU the
    table does not know. Example: applier budget --target ComfyUI/ --model flux-dev --size 32768x18432 --gpu rtx-4090
    """
    from applier import budget
    from applier.budget.caps import read_target_caps
    from applier.budget.data import load_budget_data
    from applier.budget.template import template_for
    from applier.budget.vram import dynamic_vram_of
    width, height = size
    data = load_budget_data()
    model = budget.find_model(data, model_name)
    if frames is not None and not model.video:
        raise click.BadParameter(f"{model.name} makes images; --frames is for video models", param_hint="--frames")
    found = invocation.target(gpu=gpu_name is None)
    gpu, how, memory_mib = budget.choose_gpu(data, gpu_name, [(g.name, g.memory_mib) for g in found.gpus],
                                             found.gpu_problem)
    template = None if steps else template_for(data, model)
    dynamic_vram, vram_how = dynamic_vram_of(found)
    request = budget.Request(
        model, gpu, budget.Canvas(width, height, frames or model.frames), steps or model.steps,
        model.cfg_forwards if cfg is None else (1 if cfg == 1.0 else 2), within, found.comfyui_version,
        sys.platform.startswith("win"), memory_mib, how, template.steps if template else None,
        "--steps" if steps else "the model's reference sampler", template.words() if template else "", cpu_cores,
        dynamic_vram, vram_how)
    caps = read_target_caps(found, max(width, height), data.measured.pillow_max_image_pixels)
    report = budget.plan_budget(data, request, caps)
    if invocation.as_json:
        return out_json({"target": str(found.root), **report.as_json()})
    for line in budget.report_lines(report, verbose):
        click.echo(line)

