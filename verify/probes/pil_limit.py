"""Probe for comfyui/pil-pixel-limit: can the target's ComfyUI open an image of MAX_RESOLUTION x MAX_RESOLUTION?

Runs in the target's interpreter (see verify/README.md). Imports the target's nodes.py as ComfyUI's main.py would
(the patch raises Pillow's limit when nodes.py is imported), then reads `PIL.Image.MAX_IMAGE_PIXELS` and compares
it with MAX_RESOLUTION**2. With Pillow installed it also proves the behaviour: it opens, from memory, the header of a
MAX_RESOLUTION x MAX_RESOLUTION PNG (no pixel data: nothing big is allocated), which Pillow refuses with
DecompressionBombError above 2 x MAX_IMAGE_PIXELS, at Image.open, exactly where LoadImage would fail.
"""
import io
import os
import struct
import sys
import warnings
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -I leaves this folder off sys.path
from _probe import emit, import_comfy_nodes, run  # noqa: E402 - importable only after the line above


def png_header(width, height):
    """A PNG with only IHDR and IEND: enough for Image.open to read the size and run its bomb check."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)   # 1-bit greyscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def try_open(pil_image, side):
    """'opens', 'opens with a warning' or 'refused' for a side x side image."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            pil_image.open(io.BytesIO(png_header(side, side)))
        except pil_image.DecompressionBombError:
            return "refused"
    bomb = [w for w in caught if issubclass(w.category, pil_image.DecompressionBombWarning)]
    return "opens with a warning" if bomb else "opens"


def main(args):
    root = args.get("comfyui_root")
    if not root:
        return emit("SKIP", "the target has no ComfyUI root", {})
    expect_applied = (args.get("expect") or {}).get("applied")
    nodes, real = import_comfy_nodes(root)
    max_resolution = getattr(nodes, "MAX_RESOLUTION", None)
    if not isinstance(max_resolution, int):
        return emit("FAIL", f"nodes.MAX_RESOLUTION is {max_resolution!r}, not an int", {})
    try:
        import PIL
        from PIL import Image as pil_image
    except ImportError:
        PIL = pil_image = None
    # Without Pillow (a ComfyUI-shaped test tree) the check reads the stand-in nodes.py uses as `Image`.
    image = pil_image if pil_image is not None else getattr(nodes, "Image", None)
    limit = getattr(image, "MAX_IMAGE_PIXELS", "missing")
    needed = max_resolution * max_resolution
    numbers = {"max_resolution": max_resolution, "max_resolution_squared": needed, "max_image_pixels": limit,
               "refused_above": None if not isinstance(limit, int) else 2 * limit,
               "pillow": getattr(PIL, "__version__", None), "real_comfyui": real}
    if limit == "missing":
        return emit("FAIL", "neither Pillow nor nodes.Image is available to read MAX_IMAGE_PIXELS from", numbers)
    if pil_image is not None:
        numbers["open_max_resolution_square"] = try_open(pil_image, max_resolution)
    opened = numbers.get("open_max_resolution_square")
    where = "" if pil_image is not None else " (Pillow is not installed: read from nodes.py's stand-in)"

    if limit is None:
        return emit("WARN", f"MAX_IMAGE_PIXELS is None: Pillow's decompression-bomb check is off entirely{where}",
                    numbers)
    raised = limit >= needed and opened in (None, "opens")
    if expect_applied:
        if raised:
            return emit("PASS", f"MAX_IMAGE_PIXELS = {limit} >= MAX_RESOLUTION**2 = {needed}: a {max_resolution}x"
                                f"{max_resolution} image {opened or 'is within the limit'}{where}", numbers)
        return emit("FAIL", f"the patch is recorded as applied but MAX_IMAGE_PIXELS = {limit} < MAX_RESOLUTION**2 = "
                            f"{needed}{'; a ' + str(max_resolution) + ' square image ' + opened if opened else ''}"
                            f"{where}", numbers)
    state = "not applied" if expect_applied is False else "no expectation given"
    if raised:  # e.g. MAX_RESOLUTION 8192 (2023 checkouts): Pillow's stock limit already covers it
        return emit("PASS", f"{state}: MAX_IMAGE_PIXELS = {limit} already covers MAX_RESOLUTION**2 = {needed}"
                            f"{where}", numbers)
    return emit("PASS", f"{state}: MAX_IMAGE_PIXELS = {limit}, so a {max_resolution}x{max_resolution} image "
                        f"{opened or 'exceeds the limit'} at Image.open{where}", numbers)


if __name__ == "__main__":
    run(main)
