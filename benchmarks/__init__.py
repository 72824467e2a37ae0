"""The measuring kit: `python -m benchmarks COMMAND` (see __main__.py and README.md in this folder).

Shared plumbing: comfy_release (how a ComfyUI release is started), models (how a model is built and loaded),
results (how a result is written and indexed). The commands' modules use them; none of them imports torch or
ComfyUI before its command runs.
"""
