"""A gang's next attempt started ahead on the nodes it keeps, beside the attempt they still run.

While a gang (``resources.num_nodes`` > 1, not elastic) trains through a notice to one of its nodes, the
controller prepares that node's replacement, which starts the job's process ahead once its setup is done
(agents/prestart.py) with the next attempt's gang variables: its rank, every node's address and a rendezvous port
of its own (the running attempt holds the other). Then the controller tells every other node of the gang, on its
heartbeat's reply (``prestart``: the next attempt's assignment for that node), to do the same. A kept node starts
the run command with those variables and ``RUNNER_RESUME_WAIT=1``: the launchers rendezvous, the workers import and
build, and every rank waits in ``restore()``.

The new processes get a control channel of their own (a second socket beside the node's): a checkpoint request
for the running attempt must not reach them, and their ``hello`` and ``waiting`` are not the running attempt's.
Each node reports ``started``, then ``waiting`` once every local rank waits, or ``failed`` (the process exited, or
did not wait within the bound: it is stopped then). The running attempt is never stopped early for it: the
controller tells the node on notice to checkpoint once every node waits, once one failed, or once its bound has
passed; the next attempt keeps the rendezvous port only when every node waited (otherwise another port, and every
node starts the job anew, as without this).

At the next attempt the agent adopts the process when the attempt and its gang are the ones it was started for
(agents/prestart.py); its channel becomes the node's, and the old one, now unused, is closed.

GPU memory: the new ranks build their model while the old attempt's ranks still train on the same node, which on
a GPU can run either out of memory. So a kept node starts ahead only without accelerators: the controller asks
only for a job without ``resources.accelerators``, and a node that has an accelerator device declines anyway.
"""

from __future__ import annotations

from pathlib import Path

import structlog

from runner.protocol.events import EventKind

log = structlog.get_logger(__name__)

READY_SECONDS = 300.0  # at most, for every local rank of the next attempt to wait in restore()
# A process started ahead that no attempt has adopted this long after its start is stopped: the notice proved
# false (the old attempt trains on), or the next attempt went elsewhere (a notice lasts 2 minutes at most).
UNADOPTED_SECONDS = 900.0
STARTED, WAITING, FAILED = "started", "waiting", "failed"  # a node's ``prestart`` report's ``state``
# Device files of the accelerators a runner node may have (NVIDIA, AWS Neuron, a TPU's or Gaudi's accel driver).
ACCELERATOR_DEVICES = ("/dev/nvidia0", "/dev/neuron0", "/dev/accel0", "/dev/accel/accel0")


def has_accelerator(devices=ACCELERATOR_DEVICES) -> bool:
    return any(Path(device).exists() for device in devices)


def next_socket(current: Path, configured: Path) -> Path:
    """The control socket for the processes started ahead: the one of the two the running attempt is not using."""
    return configured.with_name(configured.name + ".next") if current == configured else configured


def report(reporter, attempt: int, state: str, why: str | None = None) -> bool:
    """Tell the controller how far this node's start ahead got; whether it took the report (``started`` comes too
    late once the gang has stopped: the process is then stopped)."""
    data = {"attempt": attempt, "state": state, **({"message": why} if why else {})}
    try:
        reply = reporter.patiently(
            lambda: reporter.client.post("/v1/agent/events", {"kind": EventKind.PRESTART, "data": data}),
            "prestart report")
    except Exception as exc:  # noqa: BLE001 - the controller's bound then decides without this node's word
        log.warning("the prestart report did not reach the controller", state=state, error=str(exc))
        return False
    return bool(isinstance(reply, dict) and reply.get("accepted"))
