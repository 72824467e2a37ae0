"""What every probe in this folder shares: the verdict line, the crash-proof entry point, importing ComfyUI.

Not a probe itself (the leading underscore keeps `verify.runner.probe_path` from running it). Probes run in the
target's interpreter under `python -I`, which leaves the script's own folder off sys.path, so each probe puts this
folder at the front of sys.path before importing this module. Standard library only: the target may have nothing
else in common with the applier.
"""
import json
import os
import sys
import traceback


def emit(outcome, reason, numbers):
    """Print the verdict object (verify/README.md) as one stdout line; returns the probe's exit status."""
    print(json.dumps({"outcome": outcome, "reason": reason, "numbers": numbers}, default=str))
    return 0


def run(main):
    """Call main(the JSON object in argv[1], or {}) and exit with its status; any crash becomes a FAIL verdict."""
    try:
        sys.exit(main(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}))
    except Exception as exc:  # the verdict must be the last line whatever happens
        traceback.print_exc()
        sys.exit(emit("FAIL", f"probe crashed: {type(exc).__name__}: {exc}", {}))


def prepare_comfy_import(comfyui_root):
    """sys.path and argv as ComfyUI's main.py has them; True for a real checkout (comfy/cli_args.py exists)."""
    sys.path.insert(0, comfyui_root)
    real = os.path.isfile(os.path.join(comfyui_root, "comfy", "cli_args.py"))
    if real:
        # main.py parses the command line before anything imports torch; --cpu keeps model_management off the GPU.
        sys.argv = [os.path.join(comfyui_root, "main.py"), "--cpu"]
        try:
            import comfy.options
            comfy.options.enable_args_parsing()
        except (ImportError, AttributeError):  # checkouts before comfy/options.py parsed sys.argv unconditionally
            pass
    return real


def import_comfy_nodes(comfyui_root):
    """Import nodes.py from comfyui_root as main.py would; returns (module, is a real ComfyUI checkout)."""
    import stat
    nodes_py = os.path.join(comfyui_root, "nodes.py")
    if not stat.S_ISREG(os.stat(nodes_py).st_mode):   # importing a FIFO would block until the probe's timeout
        raise OSError(f"{nodes_py} is not a regular file (a FIFO, a device or a folder)")
    real = prepare_comfy_import(comfyui_root)
    import nodes
    return nodes, real


def read_source(path, limit=16 * 1024 * 1024):
    """The text of a regular file of the target, read without blocking (a FIFO in place of execution.py would hang
    the probe until its timeout) and at most `limit` bytes; OSError saying why otherwise."""
    import stat
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(f"{path} is not a regular file (a FIFO, a device or a folder)")
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise OSError(f"{path} is larger than {limit} bytes")
        return b"".join(chunks).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def inside(path, folder):
    """Whether path lies in folder, links resolved."""
    try:
        return os.path.commonpath([os.path.realpath(path), os.path.realpath(folder)]) == os.path.realpath(folder)
    except ValueError:  # different drives on Windows
        return False
