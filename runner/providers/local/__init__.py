"""The local provider: a simulated spot market whose nodes are processes on this machine."""

from .provider import LocalProvider

__all__ = ["LocalProvider"]
