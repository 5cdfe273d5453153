"""A command whose output's reader has gone (``runner jobs | head -1``) ends quietly, as other Unix tools do: no
message, exit status 141 (128 + SIGPIPE, what a shell reports for a tool that a closed pipe ended).

Python ignores SIGPIPE, so a write into such a pipe raises BrokenPipeError. The CLI does not set the signal back to
its default: the long-running processes it starts (``runner server``, the agent) must see a peer's closed socket as
an error, not die of it. main() catches the error once instead, and a command that only waits to write more
(``runner logs --follow``) asks ``stop_if_reader_gone`` between its polls, as ``tail -f`` does.
"""

from __future__ import annotations

import os
import select
import sys
from contextlib import contextmanager
from typing import Iterator, TextIO

from ..errors import RunnerError

OUTPUT_CLOSED_EXIT = 141


class OutputClosed(RunnerError):
    """The reader of the command's output has gone. Not an OSError: click turns an EPIPE into exit status 1."""


@contextmanager
def closed_output_ends_the_command() -> Iterator[None]:
    """A BrokenPipeError inside becomes OutputClosed, which main() ends the command on."""
    try:
        yield
    except BrokenPipeError as exc:
        raise OutputClosed() from exc


def reader_gone(stream: TextIO) -> bool:
    """Is ``stream`` a pipe (or socket) whose reading end has closed? False where that cannot be told."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # (not a file: a StringIO; a closed stream)
        return False
    if not hasattr(select, "poll"):
        return False
    poller = select.poll()
    poller.register(fd, 0)  # no events asked for: an error or a hang-up is reported all the same
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def stop_if_reader_gone(stream: TextIO) -> None:
    """End the command (through main) when nothing it writes to ``stream`` can be read any more."""
    if reader_gone(stream):
        raise OutputClosed()


def output_closed() -> int:
    """The exit status for a closed output. What is still buffered for a closed stdout or stderr goes to /dev/null:
    the interpreter flushes both as it exits, and a failed flush there prints "Exception ignored ... BrokenPipeError"."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, stream.fileno())
                os.close(devnull)
            except (OSError, ValueError):
                pass
    return OUTPUT_CLOSED_EXIT
