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

The restore's files: each node's ranks write only their own share of the gang's checkpoint locally. Once a kept
node's share of the stop's checkpoint is committed locally (a replicated state's: every rank reads every file), the
node fetches the other nodes' share as they upload it (agents/prefetch.py's LocalFillIn), and the next attempt
starts once it is here (or given up), so the restore reads local disk instead of downloading in the pause.

GPU memory: a kept node's new ranks must not build their model, nor NCCL its communicators, while the old
attempt's ranks still train on the same GPUs (either could run out of memory). So on a node with an accelerator
device every node's processes started ahead (the replacement's too: the first collective would wait for the kept
ranks anyway) get ``RUNNER_CUDA_GATE=1`` and hold *before their first CUDA use* instead of in ``restore()``
(runner/checkpoint/cuda_gate.py): interpreter, imports, launcher and rendezvous are done ahead; CUDA, the model on
the GPU and NCCL wait for ``resume``, which a kept node sends at the adoption, after the old attempt's processes on
it are gone. A rank that initialised CUDA before importing the library cannot hold there (it says so): a kept
node stops its processes and reports ``failed``, and the gang's next attempt starts anew at the handover.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import structlog

from runner.protocol.events import EventKind

from .control import ControlServer
from .failure_kind import OutputTail
from .prefetch import LocalFillIn, local_checkpoint_root, prefetch_for
from .prestart import GATE_VARIABLE, DeferredOutput, Prestarted, prestart_environment
from .supervisor import Supervisor

log = structlog.get_logger(__name__)

READY_SECONDS = 300.0  # at most, for every local rank of the next attempt to wait in restore()
# A process started ahead that no attempt has adopted this long after its start is stopped: the notice proved
# false (the old attempt trains on), or the next attempt went elsewhere (a notice lasts 2 minutes at most).
UNADOPTED_SECONDS = 900.0
STARTED, WAITING, FAILED = "started", "waiting", "failed"  # a node's ``prestart`` report's ``state``
HOLDS_BEFORE_CUDA = "before its first CUDA use (its model goes on the GPU after the handover)"
CUDA_TOO_EARLY = ("the job's script initialised CUDA before it imported runner.checkpoint, so its process started "
                  "ahead could not hold before its first CUDA use beside the running attempt; it starts at the "
                  "handover instead")
# Device files of the accelerators a runner node may have (NVIDIA, AWS Neuron, a TPU's or Gaudi's accel driver).
ACCELERATOR_DEVICES = ("/dev/nvidia0", "/dev/neuron0", "/dev/accel0", "/dev/accel/accel0")


def has_accelerator() -> bool:
    return any(Path(device).exists() for device in ACCELERATOR_DEVICES)


def holds_before_cuda(assignment: dict) -> bool:
    """Whether a gang's processes started ahead on this node hold before their first CUDA use (see the module)."""
    gang = assignment.get("gang") or {}
    return gang.get("num_nodes", 1) > 1 and not gang.get("elastic") and has_accelerator()


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


class KeptNodeStartAhead:
    """The agent's part on a kept node (mixed into agents/main.py's Agent, whose state it uses: ``prestarted``,
    ``_ahead_lock``, ``_ahead_for``, ``_ahead_abandoned``, ``prefetch``, the control channel, the reporter)."""

    def _on_committed(self, message: dict) -> None:
        super()._on_committed(message)
        if message.get("emergency") and message.get("replicated") and not message.get("durable"):
            self._fill_in_stop_step(message.get("step"))

    def _fill_in_stop_step(self, step) -> None:
        """This gang node's share of the stop's checkpoint is local: while it stays (no notice of its own), fetch
        the other nodes' share as they upload it (agents/prefetch.py's LocalFillIn), not in the next restore. Only
        for a replicated state (DDP): each rank's restore reads every file then, while a sharded one's reads only
        its own ranks' shards (and the others' would take the node's disk for nothing)."""
        if (not self.gang_node or not isinstance(step, int) or self.prefetch is not None
                or self.train_through is not None or self.emergency.active):
            return
        self.prefetch = prefetch_for(self.assignment, local_checkpoint_root(self.assignment, self.config.scratch_dir),
                                     target=step, follower=LocalFillIn)
        if self.prefetch is not None:
            log.info("fetching the other nodes' share of the stop's checkpoint ahead of the restore", step=step)

    def _on_prestart(self, assignment: dict) -> None:
        """A kept gang node is told to start the gang's next attempt ahead (this module): once per
        attempt, beside the one it runs, on a control channel of its own."""
        if assignment.get("abandoned"):  # a node failed, or the next attempt went on without the processes
            self._ahead_abandoned.set()
            return
        attempt = assignment.get("attempt")
        with self._ahead_lock:
            if (not isinstance(attempt, int) or attempt <= self.assignment.get("attempt", 0)
                    or self._ahead_for == attempt or self.prestarted is not None or self.cancelled.is_set()
                    or self.control is None):
                return
            self._ahead_for = attempt
            path = next_socket(self.control.path, self.config.control_socket)
            try:
                control = ControlServer(path, lambda message: None).start()
            except OSError as exc:
                log.warning("no control channel for the next attempt; it starts at the handover", error=str(exc))
                return
            output = DeferredOutput(self.local_log)
            tail = OutputTail(output)
            # On a GPU node its ranks hold before their first CUDA use: the running attempt has the GPUs
            env = prestart_environment(self._environment(assignment, str(path)), holds_before_cuda(assignment))
            supervisor = Supervisor(assignment["run"], str(self.config.scratch_dir / "work"), env, tail)
            try:
                supervisor.start()
            except (OSError, ValueError) as exc:
                control.close()
                log.warning("the next attempt could not be started ahead; it starts at the handover", error=str(exc))
                return
            prestarted = Prestarted(supervisor, attempt, output, tail, gang=assignment.get("gang"), control=control)
            control.on_message = prestarted.on_control
            self.prestarted = prestarted
        log.info("the gang's next attempt started ahead on this kept node", attempt=attempt,
                 port=(assignment.get("gang") or {}).get("master_port"), before_cuda=GATE_VARIABLE in env)
        threading.Thread(target=self._wait_ahead, args=(prestarted,), name="prestart", daemon=True).start()

    def _wait_ahead(self, prestarted: Prestarted) -> None:
        if not report(self.reporter, prestarted.attempt, STARTED):
            log.info("the gang stopped before its next attempt could be started ahead here; stopping it")
            self._drop_ahead(prestarted)
            return
        # (a rank that used CUDA before the library cannot hold before it: given up at once, it is on the GPUs)
        waits = prestarted.wait_in_restore(READY_SECONDS,
                                           lambda: self.cancelled.is_set() or self.shutdown.is_set()
                                           or self.prestarted is not prestarted or prestarted.cuda_in_use.is_set())
        if self.prestarted is not prestarted:
            return
        self._report_ahead(prestarted, waits)
        # Not adopted for long: the notice proved false, or the gang moved without this node; it is stopped
        given_up_at = time.monotonic() + UNADOPTED_SECONDS
        while self.prestarted is prestarted and not self.shutdown.wait(1.0):
            if time.monotonic() > given_up_at:
                log.warning("the process started ahead was not adopted in time; stopping it",
                            attempt=prestarted.attempt, seconds=UNADOPTED_SECONDS)
                self._drop_ahead(prestarted)
                return

    def _report_ahead(self, prestarted: Prestarted, waits: bool) -> None:
        """Say whether this node's ranks of the next attempt wait; one that does not is stopped now (the gang's
        next attempt then starts anew on every node, on another port)."""
        gated = GATE_VARIABLE in prestarted.supervisor.env
        if waits and not (gated and prestarted.cuda_in_use.is_set()):
            report(self.reporter, prestarted.attempt, WAITING, HOLDS_BEFORE_CUDA if gated else None)
            return
        self._drop_ahead(prestarted)
        report(self.reporter, prestarted.attempt, FAILED,
               CUDA_TOO_EARLY if gated and prestarted.cuda_in_use.is_set()
               else "the process started ahead exited or did not wait in time")

    def _drop_ahead(self, prestarted: Prestarted) -> None:
        """Stop a process started ahead, unless an attempt has adopted it meanwhile."""
        with self._ahead_lock:
            if self.prestarted is not prestarted:
                return
            self.prestarted = None
        prestarted.discard(self.config.stop_grace_seconds)

    def _discard_ahead(self) -> None:
        with self._ahead_lock:
            prestarted, self.prestarted = self.prestarted, None
        if prestarted is not None:
            prestarted.discard(self.config.stop_grace_seconds)
