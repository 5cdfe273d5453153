"""The agent's part in a multi-node job (a gang, docs/multinode.md).

- **Registration is the rendezvous barrier.** The agent registers with its address and, while the
  controller answers ``{"status": "waiting"}`` (not every node of the attempt has registered yet, or this
  node is kept and the next attempt is not planned yet), asks again. The assignment that finally comes
  carries ``gang``: the node count, this node's rank, every node's address, the rendezvous port.
- **The job's environment** gets RUNNER_NUM_NODES, RUNNER_NODE_RANK, RUNNER_NODE_IPS, RUNNER_MASTER_ADDR,
  RUNNER_MASTER_PORT and RUNNER_GPUS_PER_NODE from it (a single node is a gang of one;
  runner/protocol/environment.py).
- **A stop that came from a peer.** With torch.distributed, the checkpoint library stops every rank at
  the same step when any node gets a notice or a drill: the ranks here then say ``stopping`` with
  ``origin: "peer"``. Such a node reports that its job stopped because of a peer (not ``succeeded`` or
  ``failed``), and the controller tells it to stay for the next attempt on this same node.
- **Peers that have exited.** While the attempt still runs, the controller may say every other node has reported
  its exit (``peers-exited``: one on notice finished its part and left with its node, say). A launcher waiting at
  its exit for theirs then waits for nothing, and is ended once this node's ranks have all finished and gone.
- **The drill verdict per rank.** Every rank reports ``restored``; after a drill each node checks that
  every local rank restored the drill's step and reports them by global rank.
"""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlparse

import structlog

from runner.protocol.actions import RegisterStatus
from runner.protocol.events import EndReason

log = structlog.get_logger(__name__)


def node_address(configured: str | None, controller_url: str | None) -> str:
    """Where the other nodes of a gang reach this one: the configured address, else the source address of
    this node's route to the controller (the private address on a cloud VPC)."""
    if configured:
        return configured
    host = urlparse((controller_url or "").split(",")[0].strip()).hostname
    if host:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((host, 9))  # no packet is sent: this only picks the route
                return probe.getsockname()[0]
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def register_for_attempt(register, address: str, stop: threading.Event) -> dict | None:
    """Register until the controller hands over an assignment; None when it refuses this node (the job
    ended or the node was released) or ``stop`` is set."""
    said = None
    while not stop.is_set():
        reply = register({"address": address})
        if reply is None:
            return None
        if reply.get("status") != RegisterStatus.WAITING:
            return reply
        if reply.get("message") != said:
            said = reply.get("message")
            log.info("waiting for the gang", why=said)
        stop.wait(float(reply.get("retry_seconds") or 0.5))
    return None


class GangRanks:
    """What this node's ranks said in one attempt: a stop learned from a peer, and the steps restored."""

    def __init__(self) -> None:
        self.peer_stop: dict | None = None
        self.ended_elsewhere = False  # the controller said the gang's attempt ended on another node
        # the controller said every other node has reported its exit while the attempt still runs (peers-exited)
        self.peers_exited = False
        self.restored: dict[str, int] = {}  # global rank (or pid when the library sends no rank) -> step
        self._lock = threading.Condition()

    def reset(self) -> None:
        with self._lock:
            self.peer_stop = None
            self.ended_elsewhere = False
            self.peers_exited = False
            self.restored = {}

    def on_stopping(self, message: dict) -> bool:
        """Record a ``stopping``; True when it came from a peer (this node had no request of its own)."""
        if message.get("origin") != "peer":
            return False
        with self._lock:
            if self.peer_stop is None:
                self.peer_stop = message
                log.info("the job stopped because a peer of the gang stopped", step=message.get("step"),
                         reason=message.get("reason"))
        return True

    def preempted_summary(self, ack: dict | None, own_summary: str) -> str:
        """The restart log's line for this node's preemption. When the node's own notice came after its ranks
        had already stopped with the gang (a peer's notice first), they never answered the node's request, but
        the gang's emergency checkpoint was taken: say that, not that nothing was acknowledged."""
        peer = self.peer_stop
        if ack is not None or not peer or not isinstance(peer.get("step"), int):
            return own_summary
        where = "durable" if peer.get("durable") else "local only (not durable before the deadline)"
        return (f"preempted: emergency checkpoint at step {peer['step']}, {where}, taken when the gang stopped "
                f"for a peer's notice, before this node's own")

    def on_stop_for_peer(self) -> bool:
        """The controller says the gang's attempt ended elsewhere; True the first time, unless the ranks here had
        stopped for a peer already (stop the job then). Either way the launcher may now wait for a node that
        left (``ended_elsewhere``)."""
        with self._lock:
            self.ended_elsewhere = True
            if self.peer_stop is not None:
                return False
            self.peer_stop = {"origin": "peer", "reason": "the gang's attempt ended"}
            return True

    def on_peers_exited(self) -> None:
        """Every other node has reported its exit: none has a launcher left to reach this launcher's exit barrier."""
        with self._lock:
            if not self.peers_exited:
                log.info("every other node of the gang has reported its exit")
            self.peers_exited = True

    def on_restored(self, message: dict) -> None:
        key = message.get("rank") if message.get("rank") is not None else f"pid {message.get('pid')}"
        with self._lock:
            self.restored[str(key)] = int(message.get("step") or 0)
            self._lock.notify_all()

    def wait_restored(self, ranks: int, timeout: float) -> bool:
        """Wait until ``ranks`` local ranks have reported their restore (every rank restores collectively, so
        they report together); False if some had not within ``timeout`` seconds."""
        with self._lock:
            return self._lock.wait_for(lambda: len(self.restored) >= ranks, timeout)

    def exit_reason(self, reason: str) -> str:
        """The exit to report: a job that stopped for a peer did neither succeed nor fail here."""
        if self.peer_stop is not None and reason in (EndReason.SUCCEEDED, EndReason.FAILED):
            return EndReason.STOPPED_BY_PEER
        return reason

    def drill_verdict(self, result: dict, expected: int) -> dict:
        """Add every local rank's restored step to a drill verdict; a rank with another step fails it."""
        with self._lock:
            ranks = dict(self.restored)
        verdict = {**result, "ranks": ranks}
        wrong = {rank: step for rank, step in ranks.items() if step != expected}
        if result.get("passed") and wrong:
            rank, step = sorted(wrong.items())[0]
            verdict.update(passed=False, resumed_step=step,
                           message=f"a different step restored: rank {rank} restored {step} instead of {expected}")
        return verdict
