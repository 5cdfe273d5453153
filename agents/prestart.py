"""Start the job's process on a prepared replacement before its attempt exists.

A replacement prepared during a notice is ready once `setup` is done (and the process started ahead waits,
below); it then waits for the node on notice to hand over. Starting the job's process only at the handover
would put the interpreter's start, the imports and building the model into the training pause. So, where the
controller says the job restores through runner.checkpoint (``prestart`` in the prepared node's assignment:
its running attempt reported a restore), the agent starts the run command as soon as setup is done, with the
next attempt's variables, no ``RUNNER_RESUME_STEP`` and ``RUNNER_RESUME_WAIT=1``: the library waits in
``restore()`` (runner/checkpoint/resume_wait.py) and says ``waiting``; only then does the agent report the
node ready, so the node on notice trains on through this process's start. At the handover the agent adopts the
process as the attempt's (its output, buffered until then, goes to the attempt's log) and sends ``resume``
with the step handed over. A process that exits before, an attempt of another number, or a node that is not
needed after all: the process is stopped and, where there is an attempt, the job is started as usual.

A gang's next attempt is started ahead on every node (agents/gang_prestart.py has the kept nodes' side): under
``torchrun`` every local rank says ``waiting``, and the node counts as waiting once all of them have (as many as
their ``local_ranks`` says); the process is adopted only by the attempt whose gang (ranks, addresses, rendezvous
port) is the one it was started with.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import structlog

from runner.protocol import environment
from runner.protocol.messages import BadMessage, Resume, Waiting, WaitingAt

from .failure_kind import OutputTail

log = structlog.get_logger(__name__)

WAIT_VARIABLE = environment.RESUME_WAIT  # runner/checkpoint/resume_wait.py
STEP_VARIABLE = environment.RESUME_STEP
GATE_VARIABLE = environment.CUDA_GATE
BUFFER_LIMIT = 4 << 20  # what the process prints before its attempt exists, kept for the attempt's log


def prestart_environment(env: dict[str, str], before_cuda: bool = False) -> dict[str, str]:
    """The run command's variables for a process started ahead: the step comes later, over the control channel.
    ``before_cuda``: it holds before its first CUDA use rather than in restore() (a GPU gang node's: the library's
    runner/checkpoint/cuda_gate.py)."""
    out = {k: v for k, v in env.items() if k not in (STEP_VARIABLE, GATE_VARIABLE)}
    out[WAIT_VARIABLE] = "1"
    if before_cuda:
        out[GATE_VARIABLE] = "1"
    return out


class DeferredOutput:
    """Output of a process whose attempt does not exist yet: to the node's own log and a buffer, then (once
    adopted) to the attempt's shipper, the buffer first."""

    def __init__(self, local_copy):
        self._local_copy = local_copy
        self._buffer = bytearray()
        self._target = None
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._target is not None:
                target = self._target
            else:
                self._local_copy.write(data)
                self._local_copy.flush()
                if len(self._buffer) < BUFFER_LIMIT:
                    self._buffer += data[:BUFFER_LIMIT - len(self._buffer)]
                return
        target.write(data)

    def switch_to(self, shipper) -> None:
        with self._lock:
            if self._buffer:
                shipper.write(bytes(self._buffer))
                self._buffer.clear()
            self._target = shipper


WAITS_AT = {WaitingAt.RESTORE: "the process started ahead waits in restore()",
            WaitingAt.BEFORE_CUDA: "the process started ahead holds before its first CUDA use",
            WaitingAt.AFTER_CUDA: "the process started ahead holds at its import of runner.checkpoint"}

GANG_KEYS = ("num_nodes", "node_rank", "node_ips", "master_addr", "master_port")  # what a gang's launcher was given


def same_gang(started_with: dict | None, assignment: dict) -> bool:
    """Whether the attempt's gang is the one a process was started ahead for (no gang: a single node)."""
    now = assignment.get("gang") or {}
    return all((started_with or {}).get(k) == now.get(k) for k in GANG_KEYS) if started_with else True


class Prestarted:
    """The job's process started ahead of its attempt (see the module). ``control``: the control channel of its own
    where it has one (a kept gang node, whose running attempt has the node's), ``counts_before`` that channel's
    counts when it started (agents/control.py)."""

    def __init__(self, supervisor, attempt: int, output: DeferredOutput, tail: OutputTail, gang: dict | None = None,
                 control=None, counts_before: tuple[int, int] = (0, 0)):
        self.supervisor = supervisor
        self.attempt = attempt
        self.output = output
        self.tail = tail
        self.gang = gang
        self.control = control
        self.counts_before = counts_before
        self.waiting = threading.Event()  # the library said ``waiting``, every local rank of it
        self.held_at: WaitingAt | None = None  # where (the last ``waiting`` said): in restore(), or before CUDA
        # A rank said it holds after CUDA was initialised (before the library was imported): it could not hold
        # before its first CUDA use (a kept GPU node stops it: agents/gang_prestart.py)
        self.cuda_in_use = threading.Event()
        self.hello = False
        self.hellos: list[dict] = []
        self.pid: int | None = None  # the training process that said hello (torchrun's worker, say)
        self._lock = threading.Lock()
        self._waiting_pids: set = set()
        self._local_ranks = 1
        self._resume: dict | None = None
        self._send: Callable[[dict], int] | None = None

    def on_control(self, message: dict) -> None:
        op = message.get("op")
        if op == "hello":
            self.hello = True
            self.hellos.append(message)
            self.pid = message.get("pid")
        elif op == "waiting":
            self._note_where(message)
            with self._lock:
                self._waiting_pids.add(message.get("pid"))
                ranks = message.get("local_ranks")
                if isinstance(ranks, int) and not isinstance(ranks, bool) and ranks > 0:
                    self._local_ranks = max(self._local_ranks, ranks)
                if len(self._waiting_pids) >= self._local_ranks and not self.waiting.is_set():
                    self.waiting.set()
                    log.info(WAITS_AT.get(self.held_at, WAITS_AT[WaitingAt.RESTORE]), attempt=self.attempt,
                             local_ranks=len(self._waiting_pids))
                resume, send = self._resume, self._send
            if resume is not None:
                send(resume)

    def _note_where(self, message: dict) -> None:
        try:
            where = Waiting.from_json(message).where
        except BadMessage:
            where = WaitingAt.RESTORE
        self.held_at = where
        if where == WaitingAt.AFTER_CUDA and not self.cuda_in_use.is_set():
            log.warning("the process started ahead used CUDA before it imported runner.checkpoint: it cannot hold "
                        "before its first CUDA use", attempt=self.attempt, pid=message.get("pid"))
            self.cuda_in_use.set()

    def running(self) -> bool:
        return self.supervisor.process is not None and self.supervisor.process.poll() is None

    def wait_in_restore(self, bound: float, given_up: Callable[[], bool]) -> bool:
        """Wait until the process says ``waiting`` (its interpreter and imports behind it, and its model where it
        waits in restore(); before its first CUDA use where it was started with the gate), it exits, ``given_up()``
        is true, or ``bound`` seconds pass. True once it waits."""
        until = time.monotonic() + bound
        while not self.waiting.wait(0.05):
            if not self.running() or given_up():
                return False
            if time.monotonic() > until:
                log.warning("the process started ahead is not waiting yet; ready without it",
                            seconds=bound)
                return False
        return True

    def adopt(self, assignment: dict, shipper, send: Callable[[dict], int], step: int | None) -> bool:
        """Make it the attempt's process: its output to ``shipper``, and the word to resume from ``step`` (sent
        now, or as soon as it says ``waiting``). False when it cannot be (exited, another attempt)."""
        if not self.running() or assignment.get("attempt") != self.attempt or not same_gang(self.gang, assignment):
            return False
        self.output.switch_to(shipper)
        message = Resume(step, self.attempt).to_json()
        with self._lock:
            self._resume, self._send = message, send
            waiting = self.waiting.is_set()
        if waiting:
            send(message)
        log.info("the process started ahead is this attempt's", attempt=self.attempt, resume_step=step,
                 waiting=waiting)
        return True

    def discard(self, grace: float) -> None:
        if self.running():
            log.info("stopping the process started ahead: it is not needed", attempt=self.attempt)
        self.supervisor.stop(grace)
        if self.control is not None:
            self.control.close()


class LocalOutput:
    """Where a prepared replacement's setup output goes while it has no attempt: the node's own log and a buffer,
    handed to the attempt's log once the node takes over (:meth:`hand_over`), as a first node's setup output is in
    its attempt's; the last lines are kept for the report should setup fail."""

    def __init__(self, local_copy, keep: int = 2000):
        self.local_copy = local_copy
        self.keep = keep
        self._tail = b""
        self._buffer = bytearray()

    def write(self, data: bytes) -> None:
        self.local_copy.write(data)
        self.local_copy.flush()
        self._tail = (self._tail + data)[-self.keep:]
        if len(self._buffer) < BUFFER_LIMIT:
            self._buffer += data[:BUFFER_LIMIT - len(self._buffer)]

    def tail(self) -> str:
        return self._tail.decode(errors="replace").strip()

    def hand_over(self, shipper) -> None:
        """The setup output, to the log of the attempt this node now runs (before anything the job prints)."""
        if self._buffer:
            shipper.write(bytes(self._buffer))
            self._buffer.clear()
