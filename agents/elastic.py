"""The agent's part in an elastic gang (``resources.min_nodes`` below ``num_nodes``, docs/elastic.md).

- **A new world.** When a node leaves the gang (or its replacement is ready), the controller's heartbeat reply is
  ``world`` with ``{"generation", "node_rank", "nnodes", "master_addr", "master_port"}``. The agent hands it on,
  unchanged plus ``"op": "world"``, to every local rank over the control channel, and again to a rank that
  connects later (a replacement's ranks connect while its agent may already know the world). The heartbeat says
  which generation the agent has delivered, so the controller repeats the action until one has been.
- **The training side's change.** Each rank says ``world_changed`` (generation, step, world size) once it has
  moved; the agent reports the first of each generation to the controller (``POST /v1/agent/world``), which
  keeps the attempt's ``world_sizes``.
- **The launcher's exit.** A launcher such as torchrun waits at its end for every node it started with (an exit
  barrier of up to 5 minutes); after a node has left the world it never comes. Once every training process of
  this node has closed its Checkpointer and gone, a launcher still running a few seconds later is ended, and the
  attempt's end on this node is the training's (``finished_training``). The same watch serves any gang whose
  attempt the controller says has ended on another node (agents/launcher_exit.py).
"""

from __future__ import annotations

import threading
from typing import Callable

import structlog

from runner.protocol.messages import Op

from .held_watch import HeldWatch

log = structlog.get_logger(__name__)

# How long a launcher may outlive every training process of a changed world, at least (longer for one that looks at
# its workers seldom: agents/launcher_interval.py)
LAUNCHER_LINGER_SECONDS = 3.0


class ElasticWorld:
    """What this node knows of its elastic world: the newest generation, delivered or not, and its reports."""

    def __init__(self, send: Callable[[dict], int], report: Callable[[dict], None]):
        self.send = send          # to every local rank; returns how many training processes got it
        self.report = report      # to the controller (in the background)
        self.world: dict | None = None  # the newest world the controller told us of
        self.delivered = 0        # the newest generation handed to at least one training process
        self.reported = 0         # the newest generation reported to the controller
        self.world_size: int | None = None  # ranks in the world before the latest change (from hello)
        self._lock = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self.world, self.delivered, self.reported, self.world_size = None, 0, 0, None

    def awaits_growth(self, job_num_nodes: int | None) -> bool:
        """Whether this node trains in a world narrower than the job's (a replacement is on its way)."""
        world = self.world
        return world is not None and isinstance(job_num_nodes, int) and world.get("nnodes", job_num_nodes) < job_num_nodes

    @property
    def changed(self) -> bool:
        """Whether the world of this attempt has changed on this node (a generation was delivered)."""
        return self.delivered > 0

    def on_world(self, world: dict) -> None:
        """The controller's ``world``: hand it to the ranks unless it is known already."""
        generation = world.get("generation")
        if not isinstance(generation, int):
            return
        with self._lock:
            if generation <= self.delivered:
                return
            self.world = world
        self._deliver()

    def on_hello(self, hello: dict) -> None:
        """A rank connected: it gets the newest world (the library ignores one it has)."""
        with self._lock:
            if self.world_size is None and isinstance(hello.get("world_size"), int):
                self.world_size = hello["world_size"]
        if self.world is not None:
            self._deliver()

    def _deliver(self) -> None:
        with self._lock:
            world = self.world
        if world is None:
            return
        sent = self.send({**world, "op": Op.WORLD.value})
        if sent:
            with self._lock:
                self.delivered = max(self.delivered, world["generation"])
            log.info("new world handed to the training processes", generation=world["generation"],
                     node_rank=world.get("node_rank"), nnodes=world.get("nnodes"), delivered_to=sent)

    def on_world_changed(self, message: dict) -> None:
        """A rank moved to a new world: report each generation once."""
        generation, step, size = message.get("generation"), message.get("step"), message.get("world_size")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (generation, step, size)):
            return
        with self._lock:
            if generation <= self.reported:
                return
            self.reported = generation
            previous, self.world_size = self.world_size, size
        body = {"generation": generation, "step": step, "world_size": size}
        if previous is not None:
            body["previous_world_size"] = previous
        log.info("the training moved to a new world", **body)
        threading.Thread(target=self.report, args=(body,), name="world-report", daemon=True).start()


class LauncherWatch(HeldWatch):
    """Ends a launcher left waiting for nodes that left, once every training process has closed: in an elastic gang
    after its world changed, in any gang once the controller says the attempt ended on another node (a launcher
    whose workers all exited cleanly waits at its exit for the launchers of every node it started with, and one
    that left with its node never comes)."""

    def __init__(self, peers_left: Callable[[], bool], trainees_left: Callable[[], bool], stop: Callable[[], None],
                 linger: float | Callable[[], float] = LAUNCHER_LINGER_SECONDS):
        # peers_left: True once a node this launcher started with may never reach its exit; trainees_left: True
        # once every connected training process has closed and gone
        super().__init__(lambda: peers_left() and trainees_left(), self._end, linger, "launcher-watch")
        self.stop = stop

    @property
    def finished_training(self) -> bool:
        """The launcher was ended here, its training over: the attempt's end on this node is the training's."""
        return self.acted

    def _end(self) -> None:
        log.info("every training process has closed; ending the launcher, left waiting at its exit")
        self.stop()
