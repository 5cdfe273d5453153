"""Finding a job's messages in its output, where several processes print at once.

Two ranks of a gang (torchrun's workers) write to one output: printing at the same moment, one's line may land
in the middle of the other's ("rank 0: finished at step 30rank 1: finished at step 30"). A pattern anchored to line
starts (``^...`` with ``re.M``) then misses the second message, and a count comes out short under load. These
find every occurrence of a message wherever it starts, so write patterns that say where a message *ends*
(a number's last digit, a word), not where its line begins.
"""

from __future__ import annotations

import re

# Where a number in a message ends: before a non-digit, or where another process's log line that landed right after
# it starts with its timestamp ("resumed from step 20" + "2026-11-26 19:50:34 [info ] ..." reads "step 202026-11-26");
# a plain ``(?!\d)`` misses that message.
NUMBER_END = r"(?=\D|$|\d{4}-\d\d-\d\d )"


def occurrences(pattern: str, output: str) -> list:
    """Every occurrence of ``pattern`` in ``output``, whether or not it starts a line (``re.findall``'s results: the
    groups where the pattern has any)."""
    return re.findall(_unanchored(pattern), output)


def first(pattern: str, output: str) -> re.Match | None:
    """The first occurrence of ``pattern`` in ``output``, wherever it starts (None without one)."""
    return re.search(_unanchored(pattern), output)


def _unanchored(pattern: str) -> str:
    if pattern.startswith("^"):
        raise ValueError(f"{pattern!r}: a message may start mid-line when processes print at once; drop the '^'")
    return pattern
