"""The overlay pack's installer: install / uninstall / list (overlays), the node-pack export (node_pack) and
`applier overlay check` (check). It reads the pack's metadata from the catalog (applier.catalog.packmeta) and writes
only through the store."""
