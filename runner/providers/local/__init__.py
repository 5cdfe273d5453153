"""The local provider: a simulated spot market whose nodes are processes on this machine."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .provider import LocalProvider

__all__ = ["LocalProvider"]


def __getattr__(name: str):
    # Imported on first use: each simulated node runs `python -m runner.providers.local.node`, which only needs its
    # metadata servers, and the provider (the store, the job-file schema, structlog) is most of a second of CPU.
    if name == "LocalProvider":
        from .provider import LocalProvider

        return LocalProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
