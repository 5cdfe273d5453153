"""Checkpoint URLs: a scheme that an installed fsspec filesystem knows, or a plain local path.

fsspec's registry only, never the filesystems' own imports beyond the one named (and never torch): a job file is
validated on the user's machine and by the controller, neither of which trains.
"""

from __future__ import annotations

import re

import fsspec

from .. import local_durable  # noqa: F401 - registers local-durable://, the local market's durable tier
from ..protocol.urls import redact

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# The runner's extras that install a cloud bucket's filesystem (pyproject.toml).
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}


def check_fsspec_url(url: str) -> None:
    """Raise ValueError naming the known schemes (and the extra to install) unless fsspec can open ``url``."""
    match = _SCHEME.match(url)
    if match is None:
        return  # a path on the node: fsspec's local filesystem
    scheme = match.group(1).lower()
    known = sorted(fsspec.available_protocols())
    if scheme not in known:
        raise ValueError(f"{redact(url)!r}: no installed fsspec filesystem knows the scheme {scheme}://; "
                         f"known schemes: {', '.join(known)}. For buckets use s3:// "
                         "(pip install 'spot-runner[s3]') or gs:// (pip install 'spot-runner[gcs]')")
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError as exc:
        extra = EXTRAS.get(scheme)
        fix = f"pip install 'spot-runner[{extra}]'" if extra else f"install the package it needs ({exc})"
        raise ValueError(f"{redact(url)!r}: the {scheme}:// filesystem is not installed here; {fix}") from None
