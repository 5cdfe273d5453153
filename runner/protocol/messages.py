"""The messages on the control socket between the agent and the training library (docs/protocol.md).

Each message is a frozen dataclass with ``to_json()`` (the dict that framing.py writes as one line) and
``from_json()`` (from such a dict: unknown fields are passed over, a missing or mistyped field is a
:class:`BadMessage` naming it). :func:`parse` picks the class by ``op``; an op it does not know is an
:class:`UnknownOp`, which a receiver logs and passes over (a newer peer may send ops this side predates).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from .enums import StrEnum
from .errors import RunnerError


class Op(StrEnum):
    # library -> agent
    HELLO = "hello"
    RESTORED = "restored"
    COMMITTED = "committed"
    STOPPING = "stopping"
    FAILED = "failed"
    TELEMETRY = "telemetry"
    MANIFEST = "manifest"
    REQUEST_SEEN = "request_seen"
    CLOSED = "closed"
    HOLDING = "holding"
    WAITING = "waiting"
    WORLD_CHANGED = "world_changed"
    # agent -> library
    CHECKPOINT = "checkpoint"
    RECORDED = "recorded"
    RELEASE = "release"
    RESUME = "resume"
    WORLD = "world"


class StopReason(StrEnum):
    """Why the agent asks for a checkpoint (a request's ``reason``; the training script reads it as
    ``Checkpointer.stop_reason``). The library also names its own requests (``SIGTERM``, ``agent_gone``...)."""

    NOTICE = "notice"
    REBALANCE = "rebalance"
    DRILL = "drill"
    CANCEL = "cancel"
    MOVE = "move"


class WaitingAt(StrEnum):
    """Where a process started ahead of its attempt waits for ``resume`` (a ``waiting`` message's ``at``)."""

    RESTORE = "restore"  # in ``restore()``: its model built (a node whose accelerators are free, or none)
    # At its first CUDA use (runner/checkpoint/cuda_gate.py): imports done, no CUDA context yet, so a GPU node's
    # running attempt keeps its GPUs' memory
    BEFORE_CUDA = "before_cuda"
    # Where the library was imported: CUDA was already initialised then, so the hold before CUDA could not apply
    # (a kept GPU node stops such a process; the gang's next attempt starts anew at the handover)
    AFTER_CUDA = "after_cuda"


class BadMessage(RunnerError, ValueError):
    """A control message that cannot be read: its op is unknown, or a field is missing or of the wrong type."""


class UnknownOp(BadMessage):
    pass


_NUMBER = (int, float)


@dataclass(frozen=True)
class Message:
    op: ClassVar[Op]
    # Fields left out of the JSON while None (optional in the protocol, e.g. a hello's rank outside torch.distributed).
    omitted_when_none: ClassVar[frozenset[str]] = frozenset()
    # Fields that must be present, with the JSON types they may take (absent from this map: any value, default None).
    required: ClassVar[dict[str, tuple[type, ...]]] = {}

    def to_json(self) -> dict:
        data = {"op": self.op.value}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None and field.name in self.omitted_when_none:
                continue
            data[field.name] = value.value if isinstance(value, StrEnum) else value
        return data

    @classmethod
    def from_json(cls, data: dict) -> "Message":
        if data.get("op") != cls.op:
            raise BadMessage(f"not a {cls.op!r} message: op is {data.get('op')!r}")
        for name, types in cls.required.items():
            value = data.get(name)
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                raise BadMessage(f"{cls.op} message: field {name!r} is {value!r}, expected "
                                 + " or ".join(t.__name__ for t in types))
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


# --- library -> agent ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Hello(Message):
    """Right after connecting; every rank connects and says hello."""

    op: ClassVar[Op] = Op.HELLO
    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"rank", "local_rank", "world_size"})
    required: ClassVar[dict] = {"pid": (int,)}
    pid: int
    job_id: str | None = None
    attempt: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None


@dataclass(frozen=True)
class Restored(Message):
    """After ``restore()``: step 0 and no manifest for a fresh start. ``expected``: the step the controller
    handed over, when one was (a restore short of it is reported as such)."""

    op: ClassVar[Op] = Op.RESTORED
    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"expected"})
    required: ClassVar[dict] = {"step": (int,)}
    step: int
    manifest: str | None = None
    expected: int | None = None


@dataclass(frozen=True)
class Committed(Message):
    """A commit on one tier: once with ``durable`` false (local), once more with true (durable)."""

    op: ClassVar[Op] = Op.COMMITTED
    required: ClassVar[dict] = {"step": (int,), "durable": (bool,)}
    step: int
    manifest: str | None = None
    durable: bool = False
    emergency: bool = False
    seconds: float | None = None  # from the start of the save
    bytes: int | None = None
    staged_seconds: float | None = None  # of ``seconds``, the staging (the time the save blocked the training)
    # Uploaded from the staged buffer beside the local write, as one process's emergency checkpoint is (an
    # emergency or a timing checkpoint): the durable ``seconds`` is then what an emergency checkpoint takes.
    from_buffer: bool = False
    # From another node's first process than the job's first rank: its agent only times the commit (a notice
    # on that node needs the checkpoint's expected time); the job's first rank's agent reports it.
    timing_only: bool = False
    # Every rank holds the whole state (no sharded tensor): each rank's restore reads every file of the checkpoint,
    # so a kept gang node may fetch the other nodes' share ahead (agents/prefetch.py's LocalFillIn).
    replicated: bool = False


@dataclass(frozen=True)
class Stopping(Message):
    """``should_stop`` became true: the acknowledgement of a request with ``stop``."""

    op: ClassVar[Op] = Op.STOPPING
    required: ClassVar[dict] = {"step": (int,)}
    step: int
    durable: bool = False   # the checkpoint reached the durable tier before the deadline
    reason: str | None = None
    origin: str = "self"    # "peer": another rank received the request

    @property
    def from_peer(self) -> bool:
        return self.origin == "peer"


@dataclass(frozen=True)
class Failed(Message):
    """A save did not commit on a tier (the previous checkpoint is kept; training goes on)."""

    op: ClassVar[Op] = Op.FAILED
    step: int | None = None
    tier: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class Telemetry(Message):
    """The training's figures, batched (runner/checkpoint/telemetry.py)."""

    op: ClassVar[Op] = Op.TELEMETRY
    required: ClassVar[dict] = {"steps": (int,)}
    attempt: int | None = None
    steps: int = 0
    steps_per_second: float | None = None
    nan_steps: int | None = None
    peak_memory_bytes: int | None = None
    memory: str | None = None
    final: bool = False
    first_step: int | None = None
    first_step_at: float | None = None
    last_step: int | None = None
    last_step_at: float | None = None
    restore_seconds: float | None = None


@dataclass(frozen=True)
class Manifest(Message):
    """The run manifest, once (rank 0)."""

    op: ClassVar[Op] = Op.MANIFEST
    manifest: dict | None = None


@dataclass(frozen=True)
class RequestSeen(Message):
    """A stop request reached this rank's reader thread: how far the training thread got."""

    op: ClassVar[Op] = Op.REQUEST_SEEN
    reason: str | None = None
    step: int | None = None
    in_step: bool = False


@dataclass(frozen=True)
class Closed(Message):
    """``Checkpointer.close()`` is done."""

    op: ClassVar[Op] = Op.CLOSED
    step: int | None = None
    error: bool = False


@dataclass(frozen=True)
class Holding(Message):
    """A request with ``hold``: its checkpoint is taken and the training loop holds until stopped or released."""

    op: ClassVar[Op] = Op.HOLDING
    required: ClassVar[dict] = {"step": (int,)}
    step: int
    durable: bool = False


@dataclass(frozen=True)
class Waiting(Message):
    """A process started ahead of its attempt waits for the agent's ``resume``: in ``restore()``, or (``at``) before
    its first CUDA use."""

    op: ClassVar[Op] = Op.WAITING
    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"local_ranks", "at"})
    pid: int | None = None
    local_ranks: int | None = None  # the processes of this node's launcher (torchrun's LOCAL_WORLD_SIZE), if any
    at: WaitingAt | None = None  # None: in restore() (a library that predates ``at`` says none)

    @property
    def where(self) -> WaitingAt:
        try:
            return WaitingAt(self.at) if self.at is not None else WaitingAt.RESTORE
        except ValueError:  # a newer library's place: it waits all the same
            return WaitingAt.RESTORE


@dataclass(frozen=True)
class WorldChanged(Message):
    """An elastic gang's ranks moved to the world of ``generation`` at ``step`` (rank 0 of the new world only)."""

    op: ClassVar[Op] = Op.WORLD_CHANGED
    required: ClassVar[dict] = {"generation": (int,), "step": (int,), "world_size": (int,)}
    generation: int
    step: int
    world_size: int


# --- agent -> library ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointRequest(Message):
    """A request to checkpoint now: from the agent (``op: checkpoint``), or from a signal (``reason`` names it).
    ``stop`` is the emergency path (save, wait until durable or the deadline, then ``should_stop``)."""

    op: ClassVar[Op] = Op.CHECKPOINT
    reason: str = StopReason.NOTICE.value
    stop: bool = False
    deadline: float | None = None  # unix seconds
    hold: bool = False  # checkpoint, then hold the training loop until stopped or released (never with stop)
    # A timing checkpoint (a notice trained through): saved the way an emergency checkpoint is, its upload from
    # the staged buffer beside the local write, so that its time predicts the emergency's; training goes on.
    timing: bool = False

    def to_json(self) -> dict:
        data = {"op": self.op.value, "reason": str(self.reason), "deadline": self.deadline, "stop": self.stop}
        if self.hold:
            data["hold"] = True
        if self.timing:
            data["timing"] = True
        return data

    @classmethod
    def from_json(cls, data: dict) -> "CheckpointRequest":
        """Lenient, as the library always read it: a missing reason is a notice, a deadline that is not a number
        none."""
        if data.get("op") != cls.op:
            raise BadMessage(f"not a {cls.op!r} message: op is {data.get('op')!r}")
        deadline = data.get("deadline")
        if not isinstance(deadline, _NUMBER) or isinstance(deadline, bool):
            deadline = None
        stop = bool(data.get("stop"))
        hold = bool(data.get("hold")) and not stop
        return cls(str(data.get("reason") or StopReason.NOTICE.value), stop,
                   float(deadline) if deadline is not None else None, hold=hold,
                   timing=bool(data.get("timing")) and not stop and not hold)

    def merge(self, other: "CheckpointRequest | None") -> "CheckpointRequest":
        """The stronger of two pending requests: stop wins, and the earlier deadline."""
        if other is None:
            return self
        deadlines = [d for d in (self.deadline, other.deadline) if d is not None]
        stop = self.stop or other.stop
        reason = self.reason if self.stop or not other.stop else other.reason
        hold = (self.hold or other.hold) and not stop
        return CheckpointRequest(reason, stop, min(deadlines) if deadlines else None, hold=hold,
                                 timing=(self.timing or other.timing) and not stop and not hold)


@dataclass(frozen=True)
class Recorded(Message):
    """The controller has recorded this durable checkpoint: retention keeps it until a newer one is recorded."""

    op: ClassVar[Op] = Op.RECORDED
    required: ClassVar[dict] = {"step": (int,)}
    step: int

    @classmethod
    def from_json(cls, data: dict) -> "Recorded":
        recorded = super().from_json(data)
        if recorded.step < 0:
            raise BadMessage(f"recorded message: field 'step' is {recorded.step}, expected a step of at least 0")
        return recorded


@dataclass(frozen=True)
class Release(Message):
    """The end of a hold: the notice was false, training goes on."""

    op: ClassVar[Op] = Op.RELEASE


@dataclass(frozen=True)
class Resume(Message):
    """To a process started ahead of its attempt: the attempt exists; ``step`` is what it resumes from (None:
    nothing)."""

    op: ClassVar[Op] = Op.RESUME
    step: int | None = None
    attempt: int | None = None


@dataclass(frozen=True)
class World(Message):
    """An elastic gang's new world: this node's rank in it and where its store listens (the new global rank 0).
    ``lost``: it was formed because a member vanished without a notice (the ranks cut the old groups off at once)."""

    op: ClassVar[Op] = Op.WORLD
    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"lost"})
    required: ClassVar[dict] = {"generation": (int,), "node_rank": (int,), "nnodes": (int,),
                                "master_addr": (str,), "master_port": (int,)}
    generation: int
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    lost: bool | None = None


MESSAGES: dict[str, type[Message]] = {cls.op.value: cls for cls in (
    Hello, Restored, Committed, Stopping, Failed, Telemetry, Manifest, RequestSeen, Closed, Holding, Waiting,
    WorldChanged, CheckpointRequest, Recorded, Release, Resume, World)}
TO_AGENT = (Op.HELLO, Op.RESTORED, Op.COMMITTED, Op.STOPPING, Op.FAILED, Op.TELEMETRY, Op.MANIFEST,
            Op.REQUEST_SEEN, Op.CLOSED, Op.HOLDING, Op.WAITING, Op.WORLD_CHANGED)
FROM_AGENT = (Op.CHECKPOINT, Op.RECORDED, Op.RELEASE, Op.RESUME, Op.WORLD)


def parse(data: dict) -> Message:
    """The typed message of a decoded line. Raises UnknownOp for an op this side does not know, BadMessage for a
    missing or mistyped field."""
    op = data.get("op") if isinstance(data, dict) else None
    cls = MESSAGES.get(op) if isinstance(op, str) else None
    if cls is None:
        raise UnknownOp(f"unknown control message op {op!r}: expected one of {', '.join(MESSAGES)}")
    return cls.from_json(data)
