"""The base of the protocol's enums: members are the very strings stored and sent, so a value read back from
the database or from JSON compares equal to its member, and ``str()``/f-strings give the plain value."""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """A ``str`` whose members print as their value (``enum.StrEnum`` before Python 3.11)."""

    __str__ = str.__str__
    __format__ = str.__format__

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)
