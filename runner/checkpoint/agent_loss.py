"""When the node agent is gone: stop with a checkpoint, and end the process in bounded time.

The agent that started the training process (supervise mode) sets ``RUNNER_AGENT_LOSS_GRACE_SECONDS``. If the
control channel then closes while the Checkpointer is open, the agent is gone (killed, crashed): nobody
watches the notices, ships the output or reports the end, and a process left running would hold the node's
GPUs beside the next attempt. So the library asks for a stop (``reason: agent_gone``; the ranks of a
job under torch.distributed agree on it as a ``notice``) with a deadline ``grace`` seconds away: at the next ``step()`` every rank saves, waits for the durable tier until then, and
sets ``should_stop``. A process that has not ended by the deadline (a rank stuck in a collective whose peer
is gone, a loop that never calls ``step()``) is ended there and then with exit code ``EXIT_CODE``.

Without the variable (a sidecar, whose agent may be restarted beside a training container that goes on; a
run outside the runner) a closed channel is only logged, as before.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable

from runner.protocol import environment as env

from .control import CheckpointRequest
from .log import get_logger

log = get_logger()

GRACE_VARIABLE = env.AGENT_LOSS_GRACE
REASON = "agent_gone"
EXIT_CODE = 75  # EX_TEMPFAIL: the attempt was interrupted, not failed by the job


def grace_from_env() -> float | None:
    """The grace the agent set, or None (a closed channel is then only logged)."""
    raw = os.environ.get(GRACE_VARIABLE)
    try:
        value = float(raw) if raw else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


class AgentLoss:
    """Turns the loss of the agent into a stop request and, ``grace`` seconds later, the end of the process."""

    def __init__(self, grace: float | None, request: Callable[[CheckpointRequest], None],
                 exit_process: Callable[[int], None] = os._exit):
        self.grace = grace
        self._request = request
        self._exit = exit_process
        self.lost = threading.Event()

    def on_lost(self) -> None:
        if self.grace is None or self.lost.is_set():
            return
        self.lost.set()
        deadline = time.time() + self.grace
        log.error("the node agent is gone: stopping at the next step with a checkpoint; this process ends within "
                  "the grace", grace_s=self.grace)
        self._request(CheckpointRequest(REASON, True, deadline))
        threading.Thread(target=self._end_at, args=(time.monotonic() + self.grace,), name="runner-agent-loss",
                         daemon=True).start()

    def _end_at(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.01, deadline - time.monotonic())))
        print(f"[runner] the node agent is gone and this process did not end within {self.grace:g} s: ending it "
              f"(exit code {EXIT_CODE})", file=sys.stderr, flush=True)
        self._exit(EXIT_CODE)
