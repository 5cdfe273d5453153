"""The runner's distribution: the name it is packaged under, and the file name of its wheel.

The import packages are ``runner`` and ``agents`` and the console script ``runner``; the distribution has
another name, since ``runner`` on the public package index is an unrelated project.
"""

from __future__ import annotations

from . import __version__

DIST_NAME = "spot-runner"


def wheel_filename(version: str = __version__) -> str:
    """The wheel's file name, as pip expects it (the bootstrap script saves the download under it)."""
    return f"{DIST_NAME.replace('-', '_')}-{version}-py3-none-any.whl"
