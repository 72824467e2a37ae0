"""A standard PNG of a large image, compressed on every core: blocks of rows deflated in parallel, one stream.

What ComfyUI's SaveImage writes (Pillow, compress_level 4) takes one core: at 32768x18432 that is minutes. Here the
rows are cut into blocks; each block is filtered (Paeth, PNG filter type 4, from the row above it) and deflated on
its own thread (zlib releases the GIL), with the previous block's last 32 KiB as its dictionary, ended with a sync
flush so that the blocks join into one deflate stream (the way pigz writes gzip). The zlib header and the Adler-32 of
the whole (combined from the blocks') wrap it; every block is one IDAT chunk. Any PNG reader reads the file as it
reads Pillow's; the text chunks are Pillow's (tEXt where the value is Latin-1, else iTXt), so ComfyUI's LoadImage
finds the prompt and the workflow where SaveImage puts them.

No torch: `write(path, pixels, text)` takes a uint8 array [H, W, C] (C 1, 3 or 4).
"""
from __future__ import annotations

import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"
COLOR_TYPES = {1: 0, 2: 4, 3: 2, 4: 6}          # channels -> PNG colour type (grey, grey+alpha, RGB, RGBA)
BLOCK_BYTES = 8 << 20                           # raw bytes of rows per block (a block is at least one row)
WINDOW = 32 << 10                               # deflate's window: a block's dictionary
ADLER_BASE = 65521
PAETH = 4


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def text_chunk(key: str, value: str) -> bytes:
    """Pillow's PngInfo.add_text: tEXt for a Latin-1 value, else an uncompressed iTXt."""
    try:
        return chunk(b"tEXt", key.encode("latin-1") + b"\0" + value.encode("latin-1"))
    except UnicodeEncodeError:
        return chunk(b"iTXt", key.encode("latin-1") + b"\0\0\0\0\0" + value.encode("utf-8"))


def adler32_combine(first: int, second: int, second_length: int) -> int:
    """The Adler-32 of A + B from those of A and B and B's length (zlib's adler32_combine)."""
    rem = second_length % ADLER_BASE
    sum1 = first & 0xFFFF
    sum2 = (rem * sum1) % ADLER_BASE
    sum1 += (second & 0xFFFF) + ADLER_BASE - 1
    sum2 += (first >> 16) + (second >> 16) + ADLER_BASE - rem
    sum1 %= ADLER_BASE
    sum2 %= ADLER_BASE
    return sum1 | (sum2 << 16)


def paeth_rows(rows: np.ndarray, above: np.ndarray | None) -> bytes:
    """Scanlines of `rows` ([n, W, C] uint8) filtered with Paeth, each prefixed by its filter type byte; `above`
    is the image's row before the first (None for the image's first row: zeros)."""
    height, width, channels = rows.shape
    flat = rows.reshape(height, width * channels).astype(np.int16)
    up = np.empty_like(flat)
    up[0] = 0 if above is None else above.reshape(width * channels)
    up[1:] = flat[:-1]
    left = np.zeros_like(flat)
    left[:, channels:] = flat[:, :-channels]
    upleft = np.zeros_like(flat)
    upleft[:, channels:] = up[:, :-channels]
    estimate = left + up - upleft
    to_left, to_up, to_upleft = np.abs(estimate - left), np.abs(estimate - up), np.abs(estimate - upleft)
    predictor = np.where((to_left <= to_up) & (to_left <= to_upleft), left, np.where(to_up <= to_upleft, up, upleft))
    filtered = np.empty((height, width * channels + 1), dtype=np.uint8)
    filtered[:, 0] = PAETH
    filtered[:, 1:] = (flat - predictor).astype(np.uint8)      # modulo 256, as PNG's filters are
    return filtered.tobytes()


def _deflate(raw: bytes, dictionary: bytes, level: int, last: bool) -> tuple[bytes, int]:
    compressor = zlib.compressobj(level, zlib.DEFLATED, -15, zdict=dictionary) if dictionary else \
        zlib.compressobj(level, zlib.DEFLATED, -15)
    data = compressor.compress(raw) + compressor.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH)
    return data, zlib.adler32(raw)


def _zlib_header(level: int) -> bytes:
    flevel = 0 if level <= 1 else 1 if level <= 5 else 2 if level == 6 else 3
    cmf = 0x78
    flg = flevel << 6
    flg += 31 - (cmf * 256 + flg) % 31
    return bytes((cmf, flg))


def write(out: BinaryIO, pixels: np.ndarray, text: dict[str, str] | None = None, level: int = 4,
          workers: int | None = None, block_bytes: int = BLOCK_BYTES) -> None:
    """`pixels` ([H, W, C] uint8) as a PNG to the binary file `out`, with `text` as text chunks."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] not in COLOR_TYPES:
        raise ValueError(f"a PNG takes [H, W, 1-4] uint8 pixels, not {pixels.dtype} {tuple(pixels.shape)}")
    height, width, channels = pixels.shape
    out.write(SIGNATURE)
    out.write(chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, COLOR_TYPES[channels], 0, 0, 0)))
    for key, value in (text or {}).items():
        out.write(text_chunk(key, value))
    rows_per_block = max(1, block_bytes // max(1, width * channels))
    starts = list(range(0, height, rows_per_block))

    def filtered(index: int) -> bytes:
        y0 = starts[index]
        return paeth_rows(pixels[y0:y0 + rows_per_block], pixels[y0 - 1] if y0 else None)

    def block(index: int) -> tuple[bytes, int, int]:
        raw = filtered(index)
        # the dictionary: the end of the previous block's filtered rows (its last row is enough to recompute)
        dictionary = filtered_tail(index)
        data, adler = _deflate(raw, dictionary, level, index == len(starts) - 1)
        return data, adler, len(raw)

    def filtered_tail(index: int) -> bytes:
        if index == 0:
            return b""
        y1 = starts[index]
        need = -(-WINDOW // (width * channels + 1))
        y0 = max(0, y1 - need)
        return paeth_rows(pixels[y0:y1], pixels[y0 - 1] if y0 else None)[-WINDOW:]

    out.write(chunk(b"IDAT", _zlib_header(level)))
    adler = 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for data, block_adler, length in pool.map(block, range(len(starts))):
            adler = adler32_combine(adler, block_adler, length)
            out.write(chunk(b"IDAT", data))
    out.write(chunk(b"IDAT", struct.pack(">I", adler)))
    out.write(chunk(b"IEND", b""))
