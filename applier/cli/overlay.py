"""applier overlay: install, uninstall, list, export and check the operator pack (fused kernels + a ComfyUI node)."""
from __future__ import annotations

from pathlib import Path

import click

from applier.cli.group import (cli, json_option, out_json, pass_invocation, remember_interpreter, say_interpreter,
                               target_options)


@cli.group()
def overlay():
    """Install, list and uninstall operator overlays (fused Triton kernels + a ComfyUI node)."""


@overlay.command("install")
@target_options
def overlay_install(invocation):
    """Install the overlay pack into the target environment's own site-packages and custom_nodes/ (a manifest
    tracks every file); never into a parent environment that --system-site-packages shows it.

    Example: applier overlay install --target ComfyUI/
    """
    from applier.pack import overlays
    found = invocation.target()
    meta = overlays.read_pack(overlays.OVERLAYS_DIR)
    with invocation.open_install(overlays.prefixes(found, meta), run=True) as install:
        result = overlays.install(install, meta=meta)
        remember_interpreter(invocation, install)
    if invocation.as_json:
        return out_json({"ok": True, "python": str(found.python) if found.python else None, **result})
    say_interpreter(found)
    click.echo(f"installed overlay pack {result['pack']} {result['version']}: {len(result['files'])} files")
    for where in result["roots"]:
        click.echo(f"    {where}")


@overlay.command("uninstall")
@target_options
@click.option("--force", is_flag=True, help="Also remove files edited since install (saved aside first).")
def overlay_uninstall(invocation, force):
    """Remove exactly the files the overlay install recorded.

    Example: applier overlay uninstall --target ComfyUI/
    """
    from applier.pack import overlays
    found = invocation.target()
    with invocation.open_install(overlays.prefixes(found), run=True, create=False) as install:
        result = overlays.uninstall(install, force=force)
    if invocation.as_json:
        return out_json({"ok": True, "python": str(found.python) if found.python else None, **result})
    say_interpreter(found)
    click.echo(f"removed {len(result['removed'])} files" if result["removed"] else "no overlay installed")


@overlay.command("list")
@target_options
def overlay_list(invocation):
    """Show the installed overlay pack and whether its files are intact.

    Example: applier overlay list --target ComfyUI/
    """
    from applier.pack import overlays
    found = invocation.target()
    result = overlays.listing(found, catalog=invocation.catalog)
    if invocation.as_json:
        return out_json({"python": str(found.python) if found.python else None, **result})
    say_interpreter(found)
    if result.get("recovered"):
        click.echo(result["recovered"])
    if not result["installed"]:
        from applier.pack.node_pack import Installer
        from applier.status import node_pack_installs, node_pack_lines
        by_hand = [i for i in node_pack_installs(found) if i["installed_by"] is not Installer.APPLIER]
        click.echo("no overlay installed by applier")
        for line in node_pack_lines(by_hand) if by_hand else []:
            click.echo(line)
        return
    click.echo(f"{result['pack']} {result['version']}: {result['intact']} intact, {result['modified']} modified, "
               f"{result['missing']} missing")


def _registry_field(param, value):
    """--publisher / --repository as the Comfy Registry accepts them; a usage error (exit 2) before any write."""
    from applier.pack.node_pack import registry_field_problems
    problem = registry_field_problems(**{param.name: value}).get(param.name)
    if problem:
        raise click.BadParameter(problem)
    return value


@overlay.command("export")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--publisher", metavar="ID", callback=lambda _c, p, v: _registry_field(p, v),
              help="Your Comfy Registry publisher id (fills [tool.comfy] PublisherId).")
@click.option("--repository", metavar="URL", callback=lambda _c, p, v: _registry_field(p, v),
              help="The pack's repository (fills [project.urls] Repository).")
@json_option
@pass_invocation
def overlay_export(invocation, folder, publisher, repository):
    """Write the node pack as one self-contained folder to install the ComfyUI way (ComfyUI-Manager's git URL,
    `comfy node install` once published): push it as a repository's root, or copy it into custom_nodes/.

    Example: applier overlay export dist/fused-dit --publisher me --repository https://github.com/me/fused-dit
    """
    from applier.pack.node_pack import export
    result = export(folder, publisher=publisher, repository=repository)
    if invocation.as_json:
        return out_json({"ok": True, **result})
    if result["recovered"]:
        click.echo(f"removed {result['recovered']}, an interrupted export's partial copy")
    click.echo(f"wrote {result['name']} {result['version']} ({len(result['files'])} files) to {result['folder']}")
    for rel in result["removed"]:
        click.echo(f"    removed {rel} (no longer in the pack)")


@overlay.command("check")
@target_options
@click.option("--verbose", "-v", is_flag=True,
              help="Under each line, the pack's own names for it and the long reason (the code that differs).")
def overlay_check(invocation, verbose):
    """Per model family and op family, what the node would run on this ComfyUI, or why it stays stock.

    Reads the target's ComfyUI files (no torch, no GPU): one line per op family, attention included, in words of
    ComfyUI and PyTorch; the pack's own names and the long reasons with --verbose or --json. Exit 0 with the report,
    whatever stays stock; 9 when the target holds no ComfyUI code; 3 when the overlay pack's variants.json is
    unreadable.
    Example: applier overlay check --target ComfyUI/
    """
    from applier.errors import BadTargetError
    from applier.pack.check import check_tree, report_lines
    found = invocation.target()
    if found.comfyui_root is None:
        raise BadTargetError(f"{invocation.target_path} has no ComfyUI folder",
                             hint="point --target at the ComfyUI folder")
    from applier.status import node_pack_installs, node_pack_lines, parts_line
    report = check_tree(found.comfyui_root, found.comfyui_version, node_pack=node_pack_installs(found))
    if invocation.as_json:
        return out_json({**report, "site_packages": str(found.site_packages) if found.site_packages else None,
                         "purelib": str(found.purelib) if found.purelib else None})
    click.echo(f"ComfyUI {found.comfyui_version or 'version unknown'} at {found.comfyui_root}")
    for line in node_pack_lines(report["node_pack"]) + [report["node_pack_note"] or "", parts_line(found) or ""]:
        if line:
            click.echo(line)
    for line in report_lines(report, verbose=verbose):
        click.echo(line)

