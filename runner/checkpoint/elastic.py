"""Elastic gangs, the training side: the same processes leave a process group and go on in a new one (docs/elastic.md).

The agent hands every local rank the gang's new world on the control channel (``world``: a generation, this
node's rank among ``nnodes``, and the address of the new group's store). Then, in ``Checkpointer.step()``:

* **Notice** (the old group still works): the rank that got the message sets the world-change flag in the
  step agreement's word (agreement.py), so every rank of the old group reads it at the same step and leaves
  there. A rank that reads the flag and was given no new world is the one leaving the gang: it stops.
* **Loss** (a peer vanished): a collective fails, in the user's DDP backward (the default group is a
  ``TolerantGroup``, which records the error instead of raising it) or in the agreement's round. At its
  next ``step()`` the rank leaves at once and waits for the message (up to ``RUNNER_ELASTIC_WAIT_SECONDS``;
  with none, ``should_stop`` turns true and the job recovers from its last checkpoint).

Leaving means abandoning every group of the process (NCCL is aborted, not waited on), making the new
default group over a TCPStore at the message's address, rebuilding the library's side groups, and one
all-gather (the census) of each rank's step, whether its replica may have diverged and its local folder:
the survivors must be at one step. Then the state goes only where it is missing (peer_state.py): nowhere
after a notice (the survivors hold it alike), to a joining process from a survivor, and after a loss (a step
trained on local gradients) from the lowest survivor to every rank. The samplers reshard the rest of the
epoch over the new world. ``world_changed`` is then true for that one ``step()``.

A process started with ``RUNNER_ELASTIC_JOIN=1`` (a replacement joining a running gang) does the same in
``restore()``: it waits for its ``world`` message, joins, and receives the state and the step.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from dataclasses import dataclass

from runner.protocol import messages as msg

from . import peer_state, tolerant_group, world_sockets
from .errors import CheckpointError, NoWorldToJoinError
from .group import GlooComm, folder_identity
from .log import get_logger
from .sampler import ResumableSampler

log = get_logger()

JOIN_ENV = "RUNNER_ELASTIC_JOIN"
WAIT_ENV = "RUNNER_ELASTIC_WAIT_SECONDS"
DEFAULT_WAIT_S = 120.0


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "")
    return int(raw) if raw.strip().isdigit() else None


def joining() -> bool:
    return os.environ.get(JOIN_ENV, "").strip() not in ("", "0")


def enabled() -> bool:
    """This process belongs to an elastic gang: it joins one, or ``RUNNER_MIN_NODES`` is below ``RUNNER_NUM_NODES``."""
    fewest, nodes = _env_int("RUNNER_MIN_NODES"), _env_int("RUNNER_NUM_NODES")
    return joining() or (fewest is not None and nodes is not None and fewest < nodes)


def wait_seconds() -> float:
    try:
        return max(1.0, float(os.environ.get(WAIT_ENV) or DEFAULT_WAIT_S))
    except ValueError:
        return DEFAULT_WAIT_S


def _local_world() -> tuple[int, int]:
    """(local world size, local rank), as torchrun sets them; one process per node without it."""
    return _env_int("LOCAL_WORLD_SIZE") or 1, _env_int("LOCAL_RANK") or 0


@dataclass(frozen=True)
class World:
    """One ``world`` message: where this node stands in the gang's generation ``generation``."""

    generation: int
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int

    @classmethod
    def parse(cls, message: dict) -> World | None:
        try:
            world = cls(int(message["generation"]), int(message["node_rank"]), int(message["nnodes"]),
                        str(message["master_addr"]), int(message["master_port"]))
        except (KeyError, TypeError, ValueError):
            log.warning("world message ignored: it needs generation, node_rank, nnodes, master_addr and master_port",
                        message=str(message)[:300])
            return None
        if world.generation < 1 or world.nnodes < 1 or not 0 <= world.node_rank < world.nnodes:
            log.warning("world message ignored: its numbers are out of range", message=str(message)[:300])
            return None
        return world

    def rank_and_size(self) -> tuple[int, int]:
        local_world, local_rank = _local_world()
        return self.node_rank * local_world + local_rank, self.nnodes * local_world


class WorldInbox:
    """The newest ``world`` message not yet acted on; filled by the control reader, taken by the training thread."""

    def __init__(self) -> None:
        self.generation = 0  # the world this process is in
        self._newest: World | None = None
        self._cond = threading.Condition()

    def offer(self, message: dict) -> World | None:
        """Take ``message`` when it names a newer world than any known; the world taken, else None."""
        world = World.parse(message)
        with self._cond:
            if world is None or world.generation <= max(self.generation, self._newest.generation if self._newest
                                                        else 0):
                return None  # the agent repeats a world until it is known; an old one is done with
            self._newest = world
            self._cond.notify_all()
            return world

    def pending(self) -> World | None:
        with self._cond:
            return self._newest if self._newest is not None and self._newest.generation > self.generation else None

    def wait(self, seconds: float, give_up=lambda: False) -> World | None:
        """The pending world, waiting for one up to ``seconds`` (or until ``give_up()``)."""
        end = time.monotonic() + seconds
        with self._cond:
            while True:
                if self._newest is not None and self._newest.generation > self.generation:
                    return self._newest
                left = end - time.monotonic()
                if left <= 0 or give_up():
                    return None
                self._cond.wait(min(left, 0.2))

    def accept(self, world: World) -> None:
        """This process is in ``world`` now (or gave it up: a world it failed to enter is not tried again)."""
        with self._cond:
            self.generation = world.generation


def make_default_tolerant() -> None:
    """Rebuild the training's default group (collective) as a TolerantGroup over the same store and ranks,
    so that a peer lost during the first generation does not raise in the user's code."""
    import torch.distributed as dist

    if tolerant_group.default_group() is not None:
        return
    store = dist.distributed_c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    tolerant_group.abandon()
    tolerant_group.init_default(dist.PrefixStore("runner-elastic/0/", store), rank, world)


def solo_group() -> None:
    """A group of this process alone, for a joining process that has none yet (the Checkpointer is then
    built as under torch.distributed, and restore() replaces the group with the gang's)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        tolerant_group.init_default(dist.HashStore(), 0, 1)


def enter(world: World) -> tuple[int, int]:
    """Leave every group of this process and make the new world's default group; (rank, world size)."""
    import torch.distributed as dist

    rank, size = world.rank_and_size()
    tolerant_group.abandon()
    if rank != 0:  # see _await_listener
        _await_listener(world.master_addr, world.master_port, tolerant_group.timeout().total_seconds())
    store = dist.TCPStore(world.master_addr, world.master_port, size, is_master=rank == 0,
                          timeout=tolerant_group.timeout(), wait_for_workers=False)
    tolerant_group.init_default(dist.PrefixStore(f"runner-elastic/{world.generation}/", store), rank, size)
    return rank, size


def _await_listener(host: str, port: int, seconds: float) -> None:
    """Wait until the new rank 0's store accepts connections. A TCPStore client that finds no listener backs
    off for half a second or more before it tries again, and the ranks of a new world arrive within
    milliseconds of each other, so most changes paid that pause; polling every 10 ms here does not."""
    end = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(5.0, end - time.monotonic()))):
                return
        except OSError:
            if time.monotonic() >= end:
                return  # the store's own connect reports it, with its message
            time.sleep(0.01)


def side_groups(timeout) -> tuple[GlooComm, GlooComm, GlooComm]:
    """The library's three gloo side groups (steps, writer, uploader) over the new default group's ranks
    (group.py says why three)."""
    import torch.distributed as dist

    rank, size = dist.get_rank(), dist.get_world_size()
    return tuple(GlooComm(dist.new_group(backend="gloo", timeout=timeout), rank, size) for _ in range(3))


@dataclass(frozen=True)
class Census:
    """What each rank of a new world brings to it, from one all-gather: its step (None: a joining process),
    whether its replica may differ from the others' (it trained a step on its own gradients), and which
    local folder it writes into."""

    steps: list[int | None]
    diverged: list[bool]
    folders: list[int]

    @classmethod
    def take(cls, comm, step: int | None, diverged: bool, local_root) -> Census:
        import torch
        import torch.distributed as dist

        mine = torch.tensor([-1 if step is None else int(step), int(diverged), _folder_key(local_root)],
                            dtype=torch.int64)
        everyone = [torch.empty_like(mine) for _ in range(comm.world_size)]
        dist.all_gather(everyone, mine, group=comm.group)
        rows = [row.tolist() for row in everyone]
        return cls([None if s < 0 else s for s, _, _ in rows], [bool(d) for _, d, _ in rows], [f for _, _, f in rows])

    def agreed_step(self) -> int:
        """The step every survivor left at; a CheckpointError on every rank when they differ or none is there."""
        survivors = sorted({s for s in self.steps if s is not None})
        if not survivors:
            raise CheckpointError("no rank of the new world has the training state: every rank is joining")
        if len(survivors) > 1:
            raise CheckpointError(f"the surviving ranks left their process group at different steps ({survivors}); "
                                  "they cannot go on together")
        return survivors[0]

    def folder_leader(self, rank: int) -> bool:
        """The lowest rank writing into this rank's local folder prepares and commits it."""
        return min(r for r, f in enumerate(self.folders) if f == self.folders[rank]) == rank


def _folder_key(local_root) -> int:
    """A 63-bit digest of this rank's host and local folder (ranks alike share the folder)."""
    digest = hashlib.blake2b(repr(folder_identity(local_root)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << 63) - 1)


def share_state(comm, census: Census, objects: dict, extra: dict) -> int:
    """Give the ranks of the new world that lack the state the lowest survivor's (collective on ``comm``);
    the bytes this rank sent or received. Survivors of a notice hold it already: nothing moves. A joining
    rank gets it from a survivor. After a loss the survivors may differ: the lowest one's goes to every rank.
    (peer_state.py says how it travels.)"""
    survivors = [r for r, s in enumerate(census.steps) if s is not None]
    joiners = [r for r, s in enumerate(census.steps) if s is None]
    rank = comm.rank
    if any(census.diverged):
        link = peer_state.Broadcast(comm.group, survivors[0])
        return _send(link, objects, extra) if rank == survivors[0] else _receive(link, objects, extra)
    moved = 0
    for i, joiner in enumerate(joiners):  # spread over the survivors: each sends to its own joiners in turn
        sender = survivors[i % len(survivors)]
        if rank == sender:
            moved += _send(peer_state.PointToPoint(comm.group, joiner), objects, extra)
        elif rank == joiner:
            moved += _receive(peer_state.PointToPoint(comm.group, sender), objects, extra)
    return moved


def receives(census: Census, rank: int) -> bool:
    """Whether ``rank`` takes state from a peer in this change (share_state), i.e. its tensors may be half
    overwritten when the transfer breaks."""
    survivors = [r for r, s in enumerate(census.steps) if s is not None]
    return census.steps[rank] is None or (any(census.diverged) and rank != survivors[0])


def commit(comm) -> None:
    """One small all-reduce over the new world once the state has moved: every rank leaves the change only
    when every other rank got through it. A rank that died during the change (a joiner receiving the state,
    the survivor sending it) fails this on every rank, so all of them give up the change at the same step,
    instead of some training a step in a world that is already broken (their steps would then differ)."""
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.zeros(1, dtype=torch.int64), group=comm.group)


def _send(link, objects: dict, extra: dict) -> int:
    return peer_state.send_state(link, {"objects": {name: obj.state_dict() for name, obj in objects.items()},
                                        "extra": dict(extra)})


def _receive(link, objects: dict, extra: dict) -> int:
    own = {"objects": {name: obj.state_dict() for name, obj in objects.items()}, "extra": {}}
    state = peer_state.receive_state(link, own)
    for name, obj in objects.items():
        obj.load_state_dict(state["objects"][name])
    extra.update(state["extra"])
    return sum(t.nbytes for t in peer_state.tensors_by_path(state).values())


class Phases:
    """Seconds spent in each phase of a change of world, for the log and the benchmark."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.moved_mb = 0.0  # the state this rank sent or received
        self._last = time.monotonic()

    @property
    def total(self) -> float:
        return round(sum(self.seconds.values()), 3)

    def done(self, phase: str) -> None:
        now = time.monotonic()
        self.seconds[phase] = round(now - self._last, 4)
        self._last = now


class Elastic:
    """The Checkpointer's elastic side: it owns the inbox and moves the Checkpointer's ranks to a new world."""

    def __init__(self, checkpointer, collective) -> None:
        self.ckpt = checkpointer
        self.collective = collective  # modes/collective.py: its ranks, agreement and persister
        self.inbox = WorldInbox()
        self.changed = False  # true for the one step() call at which the world changed
        self.last_phases: Phases | None = None  # how the last change's seconds were spent
        self.wait_s = wait_seconds()
        self.intact = True  # false once a transfer into this rank's state broke half way: it holds no state

    def on_world(self, message: dict) -> None:
        """The control channel's ``world`` (its reader thread). One formed after a loss (``lost``) cuts the older
        worlds' connections at once: a rank blocked in a collective with the vanished node (which sends no reset)
        fails it now instead of at RUNNER_ELASTIC_TIMEOUT_SECONDS, and leaves at its next step() as after any
        loss (world_sockets.py)."""
        world = self.inbox.offer(message)
        if world is not None and message.get("lost") is True:
            world_sockets.sever_before(world.generation)

    # ------------------------------------------------------------------ the training thread

    def drain(self) -> None:
        """close(): finish the agreement's round in flight, unless its group is broken (it would only fail)."""
        if self.broken():
            self.collective.agreement.forget()
            return
        try:
            self.collective.agreement.drain()
        except Exception as exc:  # noqa: BLE001 - a peer went away as the training ended
            log.warning("the last step agreement failed at close", error=f"{type(exc).__name__}: {exc}")

    def broken(self) -> bool:
        group = tolerant_group.default_group()
        return group is not None and group.broken

    def collect(self, step: int):
        """The agreement's decision of the last round, or None after moving to a new world here (or stopping)."""
        self.changed = False
        decision, broken = None, self.broken()
        if not broken:
            try:
                decision = self.collective.agreement.collect()
            except CheckpointError:
                raise
            except Exception as exc:  # noqa: BLE001 - the agreement's round failed: a peer is gone
                log.warning("the step agreement's collective failed; leaving the process group",
                            step=step, error=f"{type(exc).__name__}: {str(exc)[:300]}")
                broken = True
        if not broken and (decision is None or not decision.world):
            return decision
        self._leave_group(step, broken)
        return None

    def world_flag(self) -> bool:
        """Whether this rank asks every rank of the group to leave it at this step's round."""
        return self.inbox.pending() is not None and not self.broken()

    def _leave_group(self, step: int, broken: bool) -> None:
        ckpt = self.ckpt
        phases = Phases()
        leaving_request = self.collective.agreement.last_request
        self.collective.agreement.forget()
        if not broken:  # saves in flight finish on the old group, which every rank of it still serves
            ckpt.wait(self.wait_s)
        phases.done("saves")
        tolerant_group.abandon()  # first: peers stuck in a collective with this rank get an error now
        while True:
            world = self.inbox.wait(self.wait_s, give_up=lambda: self._stop_asked(leaving_request) is not None)
            phases.done("world_wait")
            if world is None:
                asked = self._stop_asked(leaving_request)
                reason = asked.reason if asked is not None else "lost"
                log.warning("this rank left its process group and no new world came for it; stopping (the job "
                            "recovers from its last checkpoint)" if broken else "this rank is leaving the gang",
                            step=step, waited_s=phases.total, reason=reason)
                self._stop(step, reason)
                return
            try:
                self._move(world, step if self.intact else None, broken, phases)
                break
            except CheckpointError as exc:  # the census: the survivors cannot go on together
                log.error("moving to the new world failed; stopping (the job recovers from its last checkpoint)",
                          step=step, generation=world.generation, error=str(exc))
                tolerant_group.abandon()
                self._stop(step, "lost")
                return
            except Exception as exc:  # noqa: BLE001 - a member died during the change: wait for the next world
                self._gave_up(world, step, exc)
        log.info("the world changed", step=step, generation=world.generation, rank=self.collective.ranks.rank,
                 world_size=self.collective.ranks.world_size, after="loss" if broken else "agreement",
                 seconds=phases.total, phases=phases.seconds, state_mb=phases.moved_mb)

    def _gave_up(self, world: World, step: int | None, exc: Exception) -> None:
        """Entering ``world`` failed on a connection (a member died during the change, or never came within
        RUNNER_ELASTIC_TIMEOUT_SECONDS): leave its groups and wait for a newer one, which the controller forms
        without the dead member; with none in RUNNER_ELASTIC_WAIT_SECONDS the caller stops (or fails restore)."""
        log.warning("entering the new world failed; waiting for a newer one", step=step,
                    generation=world.generation, holds_state=self.intact and step is not None,
                    error=f"{type(exc).__name__}: {str(exc)[:300]}")
        tolerant_group.abandon()
        self.inbox.accept(world)

    def _stop_asked(self, request):
        """A stop request this rank holds: the one it put into the last round, or one that came since."""
        ckpt = self.ckpt
        for held in (request, ckpt._signal_request, ckpt._control_request):
            if held is not None and held.stop:
                return held
        return None

    def _stop(self, step: int, reason: str) -> None:
        """Out of the gang: ``should_stop``, with a group of this process alone, so the user's exit path
        (``dist.destroy_process_group()``) works as after any stop."""
        ckpt = self.ckpt
        solo_group()
        ckpt._stop_reason = reason
        ckpt._should_stop = True
        ckpt._send(msg.Stopping(step, False, reason, origin="peer").to_json())

    def join(self) -> int:
        """A joining process's restore(): wait for its world, enter it, receive the state; the step."""
        phases = Phases()
        while True:
            world = self.inbox.wait(self.wait_s)
            if world is None:
                raise NoWorldToJoinError(f"this process was started to join an elastic gang ({JOIN_ENV}=1) but no "
                                         f"world it could enter came within {self.wait_s:.0f} s; is the agent's "
                                         "control channel there?")
            try:
                step = self._move(world, None, False, phases)
                break
            except CheckpointError:
                raise
            except Exception as exc:  # noqa: BLE001 - its sender died during the change: wait for the next world
                self._gave_up(world, None, exc)
        log.info("joined the gang", step=step, generation=world.generation, rank=self.collective.ranks.rank,
                 world_size=self.collective.ranks.world_size, seconds=phases.total,
                 phases=phases.seconds, state_mb=phases.moved_mb)
        return step

    def _move(self, world: World, step: int | None, diverged: bool, phases: Phases) -> int:
        """Enter ``world``, rebuild the Checkpointer's side groups in place, give the state to the ranks that
        lack it; the agreed step. ``step`` is None on a joining process; ``diverged``: this rank trained a
        step on its own gradients (a collective failed), so its replica may differ from the others'."""
        from .agreement import StepAgreement

        ckpt = self.ckpt
        with world_sockets.recording(world.generation):  # cut off when a newer world comes after a loss
            enter(world)
            phases.done("group")
            fresh = side_groups(tolerant_group.timeout())
            phases.done("side_groups")
        census = Census.take(fresh[0], step, diverged, ckpt.local.root)
        agreed = census.agreed_step()
        phases.done("census")
        ranks = self.collective.ranks
        for old, new in zip((ranks.steps, ranks.writer, ranks.uploader), fresh):
            old.group, old.rank, old.world_size = new.group, new.rank, new.world_size  # the persister holds these
        ranks.rank, ranks.world_size = fresh[0].rank, fresh[0].world_size
        ranks.folder_leader = self.collective.persister.folder_leader = census.folder_leader(ranks.rank)
        self.collective.agreement = StepAgreement(ranks.steps)
        ckpt.telemetry.rank = ranks.rank
        phases.done("swap_groups")  # mostly the old side groups' destructors (gloo joins its threads)
        if receives(census, ranks.rank):
            self.intact = False  # until the whole state is in: a broken transfer leaves it half overwritten
        moved = share_state(ranks.steps, census, ckpt.objects, ckpt.extra)
        commit(ranks.steps)
        self.intact = True
        for obj in ckpt.objects.values():
            if isinstance(obj, ResumableSampler):
                obj.reshard(ranks.world_size, ranks.rank)
        phases.done("state")
        phases.moved_mb = round(moved / 2**20, 1)
        self.last_phases = phases
        self.inbox.accept(world)
        world_sockets.forget_before(world.generation)
        self.changed = True
        if ranks.rank == 0:
            ckpt._send(msg.WorldChanged(world.generation, agreed, ranks.world_size).to_json())
        return agreed
