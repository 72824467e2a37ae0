"""ComfyUI custom node "SaveImagePNG": SaveImage's file, compressed on every core (fused_dit.tiling.png).

The same file name, folder, counter, metadata (the prompt and the workflow as text chunks, none with
--disable-metadata) and answer to the UI as ComfyUI's SaveImage, and the same pixels (255 x the image, clipped and
truncated to 8 bits); only the compression runs on every core. This module imports no torch.
"""
from __future__ import annotations

import json
import os

ROWS_PER_STRIP = 512        # rows converted to 8 bits at once (bounded temporaries on a 32K image)


def to_uint8(image):
    """SaveImage's pixels of one [H, W, C] image: clip(255 x image, 0, 255) truncated to uint8, as a numpy array,
    converted in strips of rows."""
    import numpy as np
    import torch
    image = image.detach()
    out = np.empty(tuple(image.shape), dtype=np.uint8)
    target = torch.from_numpy(out)
    for y in range(0, image.shape[0], ROWS_PER_STRIP):
        strip = image[y:y + ROWS_PER_STRIP].to(device="cpu", dtype=torch.float32)
        target[y:y + ROWS_PER_STRIP] = (strip * 255.0).clamp_(0, 255).to(torch.uint8)
    return out


class SaveImagePNG:
    CATEGORY = "image"
    RETURN_TYPES = ()
    FUNCTION = "save_images"
    OUTPUT_NODE = True
    DESCRIPTION = ("Saves the images to your ComfyUI output folder as Save Image does (same names, metadata and "
                   "pixels), with the PNG compressed on every core: for 16K-32K images.")

    def __init__(self):
        import folder_paths
        self.output_dir = folder_paths.get_output_directory()
        self.type = "output"
        self.compress_level = 4

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE", {"tooltip": "The images to save."}),
                             "filename_prefix": ("STRING", {"default": "ComfyUI",
                                                            "tooltip": "As Save Image's prefix."})},
                "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"}}

    def save_images(self, images, filename_prefix="ComfyUI", prompt=None, extra_pnginfo=None):
        import folder_paths
        from fused_dit.tiling import png
        try:
            from comfy.cli_args import args
            metadata = not args.disable_metadata
        except ImportError:
            metadata = True
        folder, filename, counter, subfolder, filename_prefix = folder_paths.get_save_image_path(
            filename_prefix, self.output_dir, images[0].shape[1], images[0].shape[0])
        results = []
        for batch_number, image in enumerate(images):
            text = {}
            if metadata:
                if prompt is not None:
                    text["prompt"] = json.dumps(prompt)
                for key, value in (extra_pnginfo or {}).items():
                    text[key] = json.dumps(value)
            file = f"{filename.replace('%batch_num%', str(batch_number))}_{counter:05}_.png"
            with open(os.path.join(folder, file), "wb") as out:
                png.write(out, to_uint8(image), text, level=self.compress_level)
            results.append({"filename": file, "subfolder": subfolder, "type": self.type})
            counter += 1
        return {"ui": {"images": results}}
