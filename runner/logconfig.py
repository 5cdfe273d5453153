"""structlog setup: JSON lines to a file for the daemons, readable key=value output on a terminal.

A daemon's JSON lines also go to stderr when ``RUNNER_LOG_STDERR`` is set to 1 (what container platforms
collect: ``docker logs``, ``kubectl logs``), and only to stderr when its log file cannot be opened.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path
from typing import TextIO

import structlog

from .errors import Unreachable

STDERR_VARIABLE = "RUNNER_LOG_STDERR"


def stderr_requested(env=None) -> bool:
    """Does ``RUNNER_LOG_STDERR`` ask for the JSON lines on stderr too? (1, true, yes or on)"""
    value = (os.environ if env is None else env).get(STDERR_VARIABLE, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


class _Tee:
    """A text stream writing to a file and to stderr; a broken stderr never stops the file."""

    def __init__(self, file: TextIO, stderr: TextIO):
        self.file = file
        self.stderr = stderr

    def write(self, text: str) -> int:
        self.file.write(text)
        try:
            self.stderr.write(text)
        except (OSError, ValueError):
            pass
        return len(text)

    def flush(self) -> None:
        self.file.flush()
        try:
            self.stderr.flush()
        except (OSError, ValueError):
            pass


class CurrentStderr:
    """``sys.stderr`` as it is at each write, not as it was when logging was set up.

    A logger bound to the stream object of the moment keeps it after it is replaced and closed (a caller that
    captured stderr for a while, a daemon that redirects it), and every later log line then raises
    "I/O operation on closed file" in whatever code logged it.
    """

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _log_thread_crash(args: threading.ExceptHookArgs) -> None:
    """A thread that dies of an exception: one JSON line with its traceback, not a bare traceback on stderr."""
    if args.exc_type is SystemExit:
        return
    structlog.get_logger(__name__).error("thread crashed", thread=getattr(args.thread, "name", None),
                                         exc_info=(args.exc_type, args.exc_value, args.exc_traceback))


def _add_fields(fields: dict):
    def add(logger, method, event_dict):
        for key, value in fields.items():
            event_dict.setdefault(key, value)
        return event_dict

    return add


def _outage_said_plainly(logger, method, event_dict):
    """An ``Unreachable`` (the database, the controller) logged with its traceback: its message names the service and
    the fix, so the line keeps that as ``error`` and drops the traceback, which would only bury it."""
    exc_info = event_dict.get("exc_info")
    error = sys.exc_info()[1] if exc_info is True else exc_info[1] if isinstance(exc_info, tuple) else exc_info
    if isinstance(error, Unreachable):
        del event_dict["exc_info"]
        event_dict.setdefault("error", str(error))
    return event_dict


def configure_logging(json_file: Path | None = None, level: str = "info", stream=None,
                      to_stderr: bool | None = None, fields: dict | None = None) -> None:
    """Route structlog (and the stdlib loggers it wraps) to a JSON file or a readable stream.

    ``to_stderr`` (default: from ``RUNNER_LOG_STDERR``) copies the JSON lines to stderr. ``fields``: added to every
    line, from every thread (a worker process's number, where several write one file).
    """
    processors = [
        structlog.contextvars.merge_contextvars,
        *([_add_fields(fields)] if fields else []),
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        _outage_said_plainly,
        structlog.processors.format_exc_info,
    ]
    problem = None
    if json_file is not None:
        renderer = structlog.processors.JSONRenderer()
        try:
            json_file.parent.mkdir(parents=True, exist_ok=True)
            handle = open(json_file, "a", buffering=1)
        except OSError as exc:
            handle, problem = CurrentStderr(), exc
        else:
            if stderr_requested() if to_stderr is None else to_stderr:
                handle = _Tee(handle, CurrentStderr())
    else:
        handle = stream or CurrentStderr()
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=handle),
        cache_logger_on_first_use=False,
    )
    stdlib = logging.StreamHandler(handle)
    # Records of the stdlib loggers (uvicorn's "Exception in ASGI application", a library's warning) are rendered
    # like structlog's own: in the JSON file one line each, their traceback in the "exception" field.
    stdlib.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *processors],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer]))
    logging.basicConfig(level=logging.WARNING, handlers=[stdlib], force=True)
    if json_file is not None:
        threading.excepthook = _log_thread_crash
    if problem is not None:
        structlog.get_logger(__name__).warning("log file unusable; logging to stderr only", path=str(json_file),
                                               error=str(problem))
