"""Checks on what callers send that pydantic's types alone let through: steps, offsets, base64.

A step is a whole number from 0 (a checkpoint at step "abc" or -5 would be stored and shown); offsets and
ids fit SQLite's 64-bit integers (2**70 would be a 500). Each failure is a 422 naming the field.
"""

from __future__ import annotations

import base64
import binascii

from fastapi import HTTPException

MAX_INT = 2**63 - 1  # SQLite's INTEGER


def step(value, key: str) -> int:
    """``value`` as a step, or a 422 naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
        raise HTTPException(422, f"{key}: a step must be a whole number from 0 (got {str(value)[:40]!r})")
    return value


def progress(value: dict | None) -> dict | None:
    """A heartbeat's progress: every ``*_step`` it carries is a step (or null)."""
    for key, item in (value or {}).items():
        if key.endswith("_step") and item is not None:
            step(item, f"progress.{key}")
    return value


def base64_bytes(text: str, key: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise HTTPException(422, f"{key}: not valid base64") from None
