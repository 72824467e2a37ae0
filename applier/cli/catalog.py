"""applier catalog: the maintainer's commands, check (every variant against the upstream files it claims) and refresh
(a new variant from an edited upstream file)."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from applier.cli.group import cli, json_option, out_json, pass_invocation, patches_option
from applier.errors import RefusedError


@cli.group()
def catalog():
    """Maintainer commands: check coverage against upstream files, add variants."""


@catalog.command("check")
@click.option("--cache", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Upstream cache: <cache>/<component>/<version>/<files> (scripts/fetch_*_upstream.py fill it).")
@patches_option()
@json_option
@pass_invocation
def catalog_check(invocation, cache):
    """Every variant must apply and revert cleanly on every upstream version it claims, and no other.

    Example: applier catalog check --cache DIR
    """
    from dataclasses import asdict

    from applier.catalog.check import check_catalog
    report = check_catalog(invocation.catalog, cache)
    if invocation.as_json:
        out_json({"ok": report.ok, "cache": str(report.cache_root), "problems": report.problems,
                  "warnings": report.warnings, "rows": [asdict(row) for row in report.rows]})
    else:
        for row in report.rows:
            counts: dict[str, int] = {}
            for cell in row.cells:
                counts[cell.state.value] = counts.get(cell.state.value, 0) + 1
            summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
            click.echo(f"{row.patch_id:32} {row.variant:14} {row.versions:22} {summary}")
        for warning in report.warnings:
            click.echo(f"warning: {warning}")
        for problem in report.problems:
            click.echo(f"problem: {problem}")
        click.echo("catalog check: " + ("ok" if report.ok else f"{len(report.problems)} problem(s)"))
    if not report.ok:
        sys.exit(3)


@catalog.command("refresh")
@click.argument("patch_id")
@click.option("--upstream", type=click.Path(dir_okay=False, exists=True, path_type=Path), required=True,
              help="The new release's pristine file.")
@click.option("--edited", type=click.Path(dir_okay=False, exists=True, path_type=Path), required=True,
              help="The same file with the patch's change made by hand.")
@click.option("--path", "relpath", required=True, help="The file's path inside the component root.")
@click.option("--versions", required=True, help='Specifier the new variant covers, e.g. ">=2.16,<2.17".')
@click.option("--name", "variant_name", required=True, help="The new variant's name, e.g. 2.16.")
@patches_option()
@pass_invocation
def catalog_refresh(invocation, patch_id, upstream, edited, relpath, versions, variant_name):
    """Build a new variant's diff from an edited copy of a new upstream file and register it.

    Example: applier catalog refresh torch/stream-priority --upstream new/streams.py --edited mine/streams.py
    --path torch/cuda/streams.py --versions ">=2.16,<2.17" --name 2.16
    """
    from applier.catalog.authoring import add_variant
    from applier.resources import RESOURCE_ORIGIN
    if invocation.patches_dir is None and RESOURCE_ORIGIN == "installed":
        raise RefusedError("catalog refresh writes into the catalog, and this applier's is the copy inside its "
                           "installed package", hint="run it from a checkout, or pass --patches DIR")
    catalog = {p.id: p for p in invocation.catalog}
    if patch_id not in catalog:
        raise RefusedError(f"no patch {patch_id!r} in the catalog", hint=f"known: {', '.join(sorted(catalog))}")
    diff_path = add_variant(catalog[patch_id], upstream.read_bytes(), edited.read_bytes(), relpath, versions,
                            variant_name)
    click.echo(f"wrote {diff_path} and its [[variant]] entry in {catalog[patch_id].folder / 'patch.toml'}")

