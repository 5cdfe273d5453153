"""The ranks a Checkpointer works with, and the collectives its threads use.

``Solo`` is one process: every collective is the identity, so the save pipeline and the restore are the
same code for one process and for a torch.distributed job. ``Ranks`` is a job under torch.distributed: the
library never runs its collectives on the training's own group (it may be NCCL, and its order belongs to
the training); it makes three gloo side groups at construction, one per thread that issues collectives
(the training thread, the local writer, the uploader), because collectives on one group must be issued in
the same order on every rank, which only one thread per group guarantees.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import CheckpointConfigError, CheckpointError

# A rank that died leaves its peers waiting in a collective; torchrun stops them long before this.
SIDE_GROUP_TIMEOUT = datetime.timedelta(minutes=10)


class Solo:
    """One process: collectives return what they are given."""

    rank = 0
    world_size = 1
    group = None

    def all_true(self, flag: bool) -> bool:
        return bool(flag)

    def max_int(self, value: int) -> int:
        return int(value)

    def gather(self, obj) -> list:
        return [obj]

    def barrier(self) -> None:
        pass


class GlooComm:
    """The few collectives the library needs, on one gloo side group."""

    def __init__(self, group, rank: int, world_size: int) -> None:
        self.group, self.rank, self.world_size = group, rank, world_size

    def all_true(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on every rank."""
        import torch.distributed as dist

        value = torch.tensor([0 if flag else 1], dtype=torch.int64)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self._live())
        return int(value.item()) == 0

    def max_int(self, value: int) -> int:
        import torch.distributed as dist

        tensor = torch.tensor([int(value)], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._live())
        return int(tensor.item())

    def gather(self, obj) -> list:
        """Every rank's ``obj``, in rank order, on every rank."""
        import torch.distributed as dist

        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._live())
        return out

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self._live())

    def _live(self):
        if self.group is None:  # a collective without a group would run on the training's own (default) group
            raise CheckpointError("this side group was released when the Checkpointer closed")
        return self.group

    def release(self) -> None:
        """Destroy this side group now, while the interpreter is whole (close(), once no thread of ours uses it).

        A gloo group's worker threads live until the group's last reference goes, and one of them may still
        hold the last reference to a tensor of the collective just finished. Left to interpreter shutdown,
        such a thread frees that tensor after Python is gone and the process aborts ("terminate called without
        an active exception"; seen about once in twenty stops of a 2-rank job on a loaded machine), even after
        ``dist.destroy_process_group()``, which unregisters the group but cannot free what we still hold.
        Dropping our reference here runs the group's destructor, which joins its threads."""
        group, self.group = self.group, None
        if group is None:
            return
        import torch.distributed as dist

        try:
            dist.destroy_process_group(group)
        except (ValueError, RuntimeError):  # already destroyed with every group (the process is leaving)
            pass
        del group  # the last reference: the destructor runs here, with the GIL released while it joins


@dataclass
class Ranks:
    """This process's place in the job and the side groups of its threads."""

    rank: int
    world_size: int
    steps: GlooComm      # the training thread: agreement on steps, restore
    writer: GlooComm     # the local writer thread
    uploader: GlooComm   # the uploader thread
    folder_leader: bool  # the lowest rank writing into this rank's local folder: prepares it, commits it
    local_rank: int | None = None

    def release(self, threads_ended: bool) -> None:
        """close(): destroy the side groups no thread of ours will use again (GlooComm.release). The writer's
        and the uploader's are kept while their thread may still be inside a collective (a hung store)."""
        for comm in (self.steps, self.writer, self.uploader) if threads_ended else (self.steps,):
            comm.release()


def distributed() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - builds without distributed support
        return False
    return dist.is_available() and dist.is_initialized()


def leave_process_group() -> None:
    """Destroy every process group before a process that trains under torch.distributed exits on its own.

    Exiting with a gloo group alive can abort the process at interpreter shutdown ("terminate called without an
    active exception": gloo's worker threads outlive the interpreter), which turns a clean stop into a crash."""
    if distributed():
        import torch.distributed as dist

        dist.destroy_process_group()


def folder_identity(local_root: Path) -> tuple[str, str]:
    """What ranks sharing one local folder have alike: the host and the folder's absolute path."""
    return socket.gethostname(), str(Path(local_root).expanduser().absolute())


def join(local_root: Path, timeout: datetime.timedelta = SIDE_GROUP_TIMEOUT) -> Ranks | None:
    """The Ranks of this process when torch.distributed is initialised (collective), else None. ``timeout``
    bounds a collective of the side groups (an elastic gang's is short: a lost peer must not stall it)."""
    if not distributed():
        return None
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        groups = [dist.new_group(backend="gloo", timeout=timeout) for _ in range(3)]
    except (RuntimeError, ValueError) as exc:
        raise CheckpointConfigError(f"the checkpoint library needs the gloo backend beside the training's "
                                    f"({dist.get_backend()}): {exc}") from exc
    steps, writer, uploader = (GlooComm(g, rank, world) for g in groups)
    # Ranks of one node usually share one local folder: the lowest of them prepares and commits it.
    where = folder_identity(local_root)
    everyone = steps.gather(where)
    leader = min(r for r, w in enumerate(everyone) if w == where)
    local_rank = os.environ.get("LOCAL_RANK")
    return Ranks(rank, world, steps, writer, uploader, folder_leader=leader == rank,
                 local_rank=int(local_rank) if local_rank and local_rank.isdigit() else None)


def check_same_objects(ranks: Ranks, signature: dict) -> None:
    """Raise on every rank when the ranks built their Checkpointers differently, naming both setups."""
    everyone = ranks.steps.gather(signature)
    for rank, theirs in enumerate(everyone):
        if theirs != everyone[0]:
            raise CheckpointConfigError(
                f"rank {rank} built its Checkpointer with {_describe(theirs)}, rank 0 with {_describe(everyone[0])}; "
                f"every rank must register the same objects and options")


def _describe(signature: dict) -> str:
    objects = ", ".join(f"{name}={kind}" for name, kind in signature["objects"])
    options = ", ".join(f"{k}={v!r}" for k, v in signature.items() if k != "objects")
    return f"({objects}; {options})" if options else f"({objects})"
