"""SIGTERM and SIGUSR1 as checkpoint notices: the handler only records the request.

Handlers are installed only from the main thread (Python allows nothing else) and the previous handlers
are put back by ``uninstall``. They are not chained: the default action would kill the process before the
emergency checkpoint, and a framework's handler may raise inside the training step. A framework that
installs its own handler over ours (Lightning) is overridden again with ``reclaim``; a handler of ours that
a framework puts back after ``uninstall`` acts as the one it replaced.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from runner.protocol import environment as env

from .control import CheckpointRequest

SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None)) if s is not None)
DEFAULT_GRACE_S = 30.0  # GCP gives about 30 s between SIGTERM and power-off


def grace_from_env() -> float | None:
    """Seconds between a signal and the end of the machine: RUNNER_SIGNAL_GRACE_SECONDS, 0 for unknown."""
    raw = os.environ.get(env.SIGNAL_GRACE_SECONDS)
    if raw is None:
        return DEFAULT_GRACE_S
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_GRACE_S
    return value if value > 0 else None


class SignalNotices:
    """Turns SIGTERM/SIGUSR1 into ``CheckpointRequest(stop=True)`` passed to ``on_request``."""

    def __init__(self, on_request) -> None:
        self._on_request = on_request
        self._previous: dict[int, object] = {}
        self._original: dict[int, object] = {}  # after uninstall: what our handlers replaced
        self.grace_s = grace_from_env()

    def install(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return True

    def reclaim(self) -> None:
        """Install our handlers again over whatever replaced them; ``uninstall`` still restores the originals."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self._previous:
            signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        if signum not in self._previous:  # uninstalled, yet put back by someone: act as the original did
            self._act_as_original(signum, frame)
            return
        deadline = time.time() + self.grace_s if self.grace_s else None
        self._on_request(CheckpointRequest(signal.Signals(signum).name, True, deadline))

    def uninstall(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous.items():
            self._original[signum] = previous
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _act_as_original(self, signum, frame) -> None:
        original = self._original.get(signum, signal.SIG_DFL)
        if callable(original):
            original(signum, frame)
        elif original != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
