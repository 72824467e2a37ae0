"""The file line model: a file split on LF, each line with its own ending, the BOM held apart, and the
keys that matching compares."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

BOM = b"\xef\xbb\xbf"
_LF = b"\n"
_CRLF = b"\r\n"


@dataclass
class _FileLines:
    has_bom: bool
    contents: list[bytes]          # each line without its ending
    endings: list[bytes]           # b"\n", b"\r\n" or b"" (only the last line)
    keys: list[bytes]              # what matching compares
    _lines_by_key: dict[bytes, list[int]] | None = field(default=None, repr=False, compare=False)
    positions_tried: int = field(default=0, repr=False, compare=False)    # by locate, against its budget

    @property
    def count(self) -> int:
        return len(self.contents)

    def lines_with_key(self, key: bytes) -> list[int]:
        """The indices of the lines whose key is `key`, in order. The index is built once per file, so that locating
        a hunk looks up where its lines occur instead of trying every line of the file for every hunk."""
        if self._lines_by_key is None:
            index: dict[bytes, list[int]] = {}
            for number, line_key in enumerate(self.keys):
                index.setdefault(line_key, []).append(number)
            self._lines_by_key = index
        return self._lines_by_key.get(key, [])

    def dominant_ending(self) -> bytes:
        counts = Counter(ending for ending in self.endings if ending)
        if counts[_CRLF] > counts[_LF]:
            return _CRLF
        return _LF

    def render(self, lines: list[tuple[bytes, bytes]]) -> bytes:
        return (BOM if self.has_bom else b"") + b"".join(content + ending for content, ending in lines)


def _key(content: bytes) -> bytes:
    return content[:-1] if content.endswith(b"\r") else content


def _split_file(data: bytes) -> _FileLines:
    has_bom = data.startswith(BOM)
    body = data[len(BOM):] if has_bom else data
    contents: list[bytes] = []
    endings: list[bytes] = []
    parts = body.split(_LF)
    for part in parts[:-1]:
        if part.endswith(b"\r"):
            contents.append(part[:-1])
            endings.append(_CRLF)
        else:
            contents.append(part)
            endings.append(_LF)
    if parts[-1] or (has_bom and not contents):
        # a final line without newline; a file of only a BOM counts as one empty line without newline, the way a
        # diff of it shows that BOM line
        contents.append(parts[-1])
        endings.append(b"")
    return _FileLines(has_bom, contents, endings, [_key(c) for c in contents])


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _display(text: str | bytes) -> str:
    raw = text if isinstance(text, bytes) else _encode(text)
    return raw.decode("utf-8", "replace")
