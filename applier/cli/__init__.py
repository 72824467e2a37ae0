"""The command line (Click): parse, call the core, print; the only layer that prints. group.py holds the entry point,
the group and the Invocation each command receives; the commands live in modules by family, each registering on the
group as it is imported: patches (detect, list, status, apply, revert, accept, clean, explain), verify, overlay,
budget, catalog."""
from applier.cli import budget, catalog, overlay, patches, verify  # noqa: F401  (each registers its commands)
from applier.cli.group import cli, main

__all__ = ["cli", "main"]
