"""The library's logger: structlog when it is importable, else the standard library's logging."""

from __future__ import annotations

import logging

try:  # structlog is optional: the library must import with only torch and fsspec
    import structlog
except ImportError:  # pragma: no cover - depends on the environment
    structlog = None


class _StdlibLogger:
    """Accepts structlog-style calls (``log.warning("event", key=value)``) and prints ``key=value`` pairs."""

    def __init__(self, name: str) -> None:
        self._log = logging.getLogger(name)

    def _emit(self, level: int, event: str, fields: dict) -> None:
        if self._log.isEnabledFor(level):
            extra = " ".join(f"{k}={v!r}" for k, v in fields.items())
            self._log.log(level, f"{event} {extra}".rstrip())

    def debug(self, event: str, **fields) -> None:
        self._emit(logging.DEBUG, event, fields)

    def info(self, event: str, **fields) -> None:
        self._emit(logging.INFO, event, fields)

    def warning(self, event: str, **fields) -> None:
        self._emit(logging.WARNING, event, fields)

    def error(self, event: str, **fields) -> None:
        self._emit(logging.ERROR, event, fields)


def get_logger(name: str = "runner.checkpoint"):
    """Return a logger taking an event string and keyword fields."""
    if structlog is not None:
        return structlog.get_logger(name)
    return _StdlibLogger(name)
