"""structlog setup: JSON lines to a file for the daemons, readable key=value output on a terminal."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import structlog


def configure_logging(json_file: Path | None = None, level: str = "info", stream=None) -> None:
    """Route structlog (and the stdlib loggers it wraps) to a JSON file or a readable stream."""
    processors = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
    ]
    if json_file is not None:
        json_file.parent.mkdir(parents=True, exist_ok=True)
        handle = open(json_file, "a", buffering=1)
        renderer = structlog.processors.JSONRenderer()
    else:
        handle = stream or sys.stderr
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=handle),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=logging.WARNING, stream=handle, force=True)
