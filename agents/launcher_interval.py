"""How long a gang's launcher may outlive every training process of its node before the agent takes it to be waiting
at its exit barrier (the watches of agents/launcher_exit.py and agents/elastic.py).

torchrun looks at its workers every ``--monitor-interval`` seconds: a worker that failed is seen at the next look,
and only then does the launcher stop the others and exit (with the failure). A launcher still running a while after
every worker exited has seen them all exit 0 and waits at its exit barrier, where that while is longer than its
interval: the linger is ``max(3 s, 2 x interval + 1 s)``, 3 s at torch's default (0.1 s since torch 2.4; 5 s before,
which makes it 11 s).

The interval is read from the launcher itself where it can be (its arguments and environment in /proc, which also
sees a launcher started by a script the job's command runs): ``--monitor-interval``/``--monitor_interval``, else
``PET_MONITOR_INTERVAL`` (torchrun reads it when the flag is absent), else the default of the torch it imported.
Where no launcher is found there (not Linux, or another launcher), the job's ``run`` command and the environment the
agent starts it with say it, else torch's default of today.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Callable, Mapping

import structlog

from . import process_tree
from .elastic import LAUNCHER_LINGER_SECONDS

log = structlog.get_logger(__name__)

MIN_LINGER_SECONDS = LAUNCHER_LINGER_SECONDS
DEFAULT_MONITOR_INTERVAL = 0.1  # torchrun's default since torch 2.4
OLD_DEFAULT_MONITOR_INTERVAL = 5.0  # before torch 2.4
ENV = "PET_MONITOR_INTERVAL"
FLAGS = ("--monitor-interval", "--monitor_interval")
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
PYTHON_OPTIONS_WITH_VALUE = ("-X", "-W", "-Q")
_IN_TEXT = re.compile(r"--monitor[-_]interval(?:=|\s+)[\"']?([^\s\"';&|]+)")
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_VERSION = re.compile(r"""__version__\s*=\s*['"](\d+)\.(\d+)""")


def linger_for(interval: float) -> float:
    """How long a launcher with this monitor interval may outlive its workers before it is taken to wait at its exit
    barrier: two looks at its workers and a second to stop the rest and exit."""
    return max(MIN_LINGER_SECONDS, 2 * interval + 1.0)


def _seconds(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 < seconds < float("inf") else None


def launcher_arguments(argv: list[str]) -> list[str] | None:
    """torchrun's own arguments (and its script's after them) when ``argv`` is torchrun's: its console script, or
    ``python -m torch.distributed.run`` (``.launch``); None for any other process."""
    value_next = False
    for i, arg in enumerate(argv):
        if Path(arg).name == "torchrun":
            return argv[i + 1:]
        if arg == "-m":
            return argv[i + 2:] if argv[i + 1:i + 2] and argv[i + 1] in LAUNCHER_MODULES else None
        if i > 0 and not arg.startswith("-") and not value_next:
            return None  # a script or a command of its own: not a launcher
        value_next = arg in PYTHON_OPTIONS_WITH_VALUE
    return None


def interval_in_arguments(args: list[str]) -> float | None:
    """The ``--monitor-interval`` among torchrun's arguments (its own come before the script's: the first wins)."""
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in FLAGS:
            return _seconds(value if eq else (args[i + 1] if i + 1 < len(args) else None))
    return None


def interval_in_command(command: str, env: Mapping[str, str]) -> float | None:
    """The ``--monitor-interval`` a shell command gives (``$VAR`` and ``${VAR}`` read from ``env``), else the
    environment's ``PET_MONITOR_INTERVAL``; None where neither says."""
    expanded = _VARIABLE.sub(lambda m: env.get(m.group(1) or m.group(2), m.group(0)), command)
    try:
        found = interval_in_arguments(shlex.split(expanded, comments=False))
    except ValueError:  # quoting shlex cannot follow: the text as it is
        match = _IN_TEXT.search(expanded)
        found = _seconds(match.group(1)) if match else None
    return found if found is not None else _seconds(env.get(ENV))


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:  # gone, or another user's
        return None


def _torch_default(pid: int) -> float | None:
    """The default monitor interval of the torch the process imported (its libraries are mapped: torch/lib,
    torch/_C), from that torch's version.py; None where it cannot be told."""
    maps = _read(process_tree.PROC / str(pid) / "maps")
    found = re.search(rb"(/\S*/torch)/(?:lib/|_C)", maps or b"")
    text = _read(Path(os.fsdecode(found.group(1))) / "version.py") if found else None
    version = _VERSION.search(text.decode(errors="replace")) if text else None
    if version is None:
        return None
    return DEFAULT_MONITOR_INTERVAL if (int(version.group(1)), int(version.group(2))) >= (2, 4) \
        else OLD_DEFAULT_MONITOR_INTERVAL


def interval_of_launcher(pid: int) -> float | None:
    """The monitor interval of the process ``pid`` when it is torchrun, else None."""
    cmdline = _read(process_tree.PROC / str(pid) / "cmdline")
    argv = [os.fsdecode(a) for a in cmdline.split(b"\0")[:-1]] if cmdline else []
    args = launcher_arguments(argv)
    if args is None:
        return None
    found = interval_in_arguments(args)
    if found is None:
        environ = _read(process_tree.PROC / str(pid) / "environ") or b""
        value = next((v for k, _, v in (e.partition(b"=") for e in environ.split(b"\0")) if k == ENV.encode()), None)
        found = _seconds(os.fsdecode(value)) if value is not None else None
    if found is None:
        found = _torch_default(pid)
    return found if found is not None else DEFAULT_MONITOR_INTERVAL


def monitor_interval(root: int | None, mark: str | None, command: str, env: Mapping[str, str]) -> float:
    """The monitor interval of the launcher among the processes of a job's command (``root`` and ``mark``:
    process_tree.members), else as the command and its environment say it, else torch's default."""
    for proc in process_tree.members(root, mark):
        found = interval_of_launcher(proc.pid)
        if found is not None:
            return found
    found = interval_in_command(command, env)
    return found if found is not None else DEFAULT_MONITOR_INTERVAL


def launcher_linger(supervisor) -> Callable[[], float]:
    """The linger for the launcher a supervisor (agents/supervisor.py) runs, worked out at its first use (once the
    watch's condition holds: the launcher has started its workers by then) and kept."""
    known: list[float] = []

    def linger() -> float:
        if not known:
            if supervisor is None or supervisor.process is None:
                interval = DEFAULT_MONITOR_INTERVAL
            else:
                interval = monitor_interval(supervisor.process.pid, supervisor.mark, supervisor.command, supervisor.env)
            known.append(linger_for(interval))
            if known[0] != MIN_LINGER_SECONDS:
                log.info("the launcher looks at its workers seldom; it is given longer to exit after them",
                         monitor_interval=interval, linger=known[0])
        return known[0]

    return linger
