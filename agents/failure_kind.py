"""Failures that a relaunch cannot fix, told from the job's exit code and the last lines of its output.

- exit 127: the shell did not find the command (a typo in ``run``, a tool not installed);
- an ``ImportError`` / ``ModuleNotFoundError`` ending the output: a package missing from the environment;
- a CUDA out-of-memory error (``torch.OutOfMemoryError``, ``torch.cuda.OutOfMemoryError``): the same
  accelerator runs out of memory again at the same point;
- the checkpoint library's ``RestoreError`` ending the output: the checkpoint does not fit the job's model, and
  every node would restore it into the same one.

Under torchrun a worker's lines carry a ``[rankN]:`` prefix and the launcher's own ``ChildFailedError`` report
comes after them: the last exception read is the worker's.

A process ended by a signal (exit 128 + its number, as a shell says it) is named by its signal for the restart
log, with what to check for SIGKILL (the kernel's out-of-memory killer sends it); it is relaunched as any
failure is: another node may have the memory.

The output's tail is read rather than a report from ``runner.checkpoint``, so that a job that never imports
the library (or fails before it could) is told as well: every Python traceback ends with its exception's line.
The controller ends such an attempt FAILED at once, without spending the job's ``recovery.max_failures``.
"""

from __future__ import annotations

import re
import signal
import threading
from typing import Iterable

from runner.protocol.environment import hide_values
from runner.protocol.events import FailureKind

TAIL_BYTES = 16 * 1024  # the last lines that can name the failure; a traceback's last line is within them

_IMPORT = re.compile(r"^(?:\w+\.)*(ModuleNotFoundError|ImportError): .+$", re.M)
_OOM = re.compile(r"^(?:torch\.(?:cuda\.)?)?OutOfMemoryError: .*$|CUDA out of memory.*$", re.M)
# An exception's last line, as Python prints it or as torchrun passes a worker's on ("[rank1]: ValueError: ...").
_TRACEBACK_END = re.compile(r"^(?:\[rank\d+\]:\s?)?((?:\w+\.)*\w+(?:Error|Exception|Interrupt|Exit)\b.*)$", re.M)
_LAUNCHER_END = re.compile(r"^(?:\w+\.)*ChildFailedError\b")  # torchrun's own, after its workers' tracebacks
# The checkpoint library's RestoreError: a verified checkpoint that does not fit the registered objects (a
# NoRoomToRestoreError, a full local disk, is another class: another node can resume from it).
_MISMATCH = re.compile(r"^(?:\w+\.)*RestoreError: .+$")
_NOT_FOUND = re.compile(r"^.*(?:command not found|No such file or directory).*$", re.M)
_TOTAL = re.compile(r"total capacity of ([\d.]+ [KMGT]iB)")
_IN_USE = re.compile(r"this process has ([\d.]+ [KMGT]iB) memory in use")


class OutputTail:
    """A sink in front of another (the log shipper): passes every byte on and keeps the last TAIL_BYTES."""

    def __init__(self, sink):
        self.sink = sink
        self._tail = b""
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            self._tail = (self._tail + data)[-TAIL_BYTES:]
        self.sink.write(data)

    def text(self) -> str:
        with self._lock:
            return self._tail.decode("utf-8", "replace")

    def clear(self) -> None:
        with self._lock:
            self._tail = b""


def classify(exit_code: int | None, output_tail: str, hide: Iterable[str] = ()) -> tuple[str, str] | None:
    """(kind, one line for the restart log and status) of a failure no relaunch can fix, or None. The line is the
    output's own: each of ``hide`` (the job's ``env`` values, its secrets) in it is shown as ``***``; a value used as
    a command (``run: $API_KEY``) is what the shell's "command not found" repeats."""
    failure = _classify(exit_code, output_tail)
    if failure is None:
        return None
    return failure[0], hide_values(failure[1], hide)


def _classify(exit_code: int | None, output_tail: str) -> tuple[str, str] | None:
    if exit_code == 127:
        lines = _NOT_FOUND.findall(output_tail)
        return FailureKind.COMMAND_NOT_FOUND, "command not found (exit 127)" + (
            f": {_short(lines[-1])}" if lines else "")
    if exit_code in (0, None):
        return None
    last_exception = ([line for line in _TRACEBACK_END.findall(output_tail) if not _LAUNCHER_END.match(line)]
                      or [""])[-1]
    oom = _OOM.findall(output_tail)
    if oom and (_OOM.search(last_exception) or not last_exception):
        return FailureKind.CUDA_OOM, _oom_message(output_tail, exit_code)
    if _IMPORT.fullmatch(last_exception):
        return FailureKind.IMPORT_ERROR, f"a module could not be imported (exit {exit_code}): {_short(last_exception)}"
    if _MISMATCH.fullmatch(last_exception):
        return FailureKind.CHECKPOINT_MISMATCH, (f"the checkpoint does not fit the job's model (exit {exit_code}): "
                                                 f"{_short(last_exception)}")
    return None


def signal_death(exit_code: int | None) -> str | None:
    """The restart log's line for a process that a signal ended (exit 128 + its number), or None."""
    if exit_code is None or not 128 < exit_code < 128 + signal.NSIG:
        return None
    try:
        name = signal.Signals(exit_code - 128).name
    except ValueError:
        return None
    line = f"killed by {name} (exit {exit_code})"
    if name == "SIGKILL":
        line += ("; the kernel's out-of-memory killer ends processes this way when the node runs out of memory: "
                 "check the job's memory use (`runner logs`), or ask for more with resources.memory_gb")
    return line


def _oom_message(output_tail: str, exit_code: int) -> str:
    total, in_use = _TOTAL.findall(output_tail), _IN_USE.findall(output_tail)
    memory = ""
    if in_use and total:
        memory = f"; {in_use[-1]} in use of the device's {total[-1]}"
    elif total:
        memory = f"; the device holds {total[-1]}"
    return f"CUDA out of memory (exit {exit_code}){memory}"


def _short(line: str, limit: int = 300) -> str:
    line = line.strip()
    return line if len(line) <= limit else line[:limit] + "..."
