"""StrEnum, the base of every outcome enum (its members are their own JSON strings), and assert_never, the last case
of an exhaustive match; each with its stand-in on Python 3.10, which has neither."""
from __future__ import annotations

import enum
import sys
from typing import NoReturn

if sys.version_info >= (3, 11):
    from enum import StrEnum
    from typing import assert_never
else:  # pragma: no cover (3.10)
    class StrEnum(str, enum.Enum):
        """A member is its value: str(), format() and json.dumps give the string, == compares with it."""
        __str__ = str.__str__
        __format__ = str.__format__

    def assert_never(value: NoReturn) -> NoReturn:
        raise AssertionError(f"unhandled value: {value!r}")

__all__ = ["StrEnum", "assert_never"]
