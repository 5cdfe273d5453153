"""Job-file errors that name the key at fault."""

from __future__ import annotations

from ..errors import InputError


class SpecError(InputError):
    """A job file that cannot be used; ``problems`` holds one line per key at fault."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))
