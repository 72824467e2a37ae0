"""The store: the only writers. A held install root, confined paths, bounded reads, `.applier/` (state, lock,
journal) and the journal that alone changes target files; it imports nothing of applier above the small shared
modules (errors, settings)."""
