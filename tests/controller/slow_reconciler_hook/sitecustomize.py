"""Test-only, never installed: the reconciler of every controller process started with this folder on PYTHONPATH
ticks every 10 minutes, not every half second, unless something wakes it (Python imports ``sitecustomize`` at
start-up). So a job whose submit does not wake the leading controller's reconciler would wait 10 minutes for its
attempt (tests/controller/test_server_workers.py)."""

from runner.scheduler import reconciler

SLOW_TICK_SECONDS = 600.0
_init = reconciler.Reconciler.__init__


def _slow_init(self, ctx, interval=SLOW_TICK_SECONDS):
    _init(self, ctx, interval=SLOW_TICK_SECONDS)


reconciler.Reconciler.__init__ = _slow_init
