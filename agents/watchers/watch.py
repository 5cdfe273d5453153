"""``runner agent watch [--cloud aws|gcp|azure]``: a smoke test of notice detection on a real VM.

Prints one JSON line per notice seen and returns 0 after the first terminal notice. Logs go to
stderr, so stdout holds only the JSON lines.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Mapping
from typing import TextIO

import structlog

from runner.logconfig import configure_logging

from .base import Notice
from .detect import NoMetadataServer, detect, endpoint_for, watchers_for
from .loop import WatchLoop

log = structlog.get_logger(__name__)


def watch(cloud: str | None, out: TextIO = sys.stdout, *, env: Mapping[str, str] | None = None,
          stop: threading.Event | None = None) -> int:
    """Watch until the first terminal notice (0), bad input (2), no metadata server (1) or ``stop`` (130)."""
    if not structlog.is_configured():
        configure_logging()
    env = os.environ if env is None else env
    try:
        endpoints = {cloud: endpoint_for(cloud, env)} if cloud else detect(env)
    except ValueError as exc:
        print(f"runner agent watch: {exc}", file=sys.stderr)
        return 2
    except NoMetadataServer as exc:
        print(f"runner agent watch: {exc}", file=sys.stderr)
        return 1
    print(f"watching {', '.join(f'{c} ({e})' for c, e in endpoints.items())}", file=sys.stderr, flush=True)
    lock = threading.Lock()

    def emit(notice: Notice) -> None:
        with lock:
            out.write(json.dumps(notice.to_json()) + "\n")
            out.flush()

    loop = WatchLoop(watchers_for(endpoints), emit).start()
    stop = stop or threading.Event()
    try:
        while not stop.is_set():
            if loop.wait_terminal(timeout=0.5) is not None:
                return 0
        return 130
    except KeyboardInterrupt:
        return 130
    finally:
        loop.stop(timeout=0.2)  # a hanging GET in flight ends with the process
