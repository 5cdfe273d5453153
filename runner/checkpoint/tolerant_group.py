"""A default process group whose collectives survive a lost peer (elastic gangs, docs/elastic.md).

When a node of an elastic gang vanishes, the next collective of the survivors fails, and the first one to
fail is usually inside the user's DDP backward, where an exception would end the training. So an elastic
job's default group is a ``TolerantGroup``: a Python ``ProcessGroup`` around the real backend's group whose
collectives record an error instead of raising it. The failed collective completes locally with the
rank's own (unreduced) tensors, later ones complete at once without communicating, and the next
``Checkpointer.step()`` sees ``broken`` and moves the survivors to a new group, where the lowest survivor's
state is broadcast over every replica (so the step trained on local gradients leaves no trace of divergence).
The idea is torchft's (its process groups record errors for its manager to act on), cut down to what DDP
needs: the work's future completes with a value whatever happened.

A collective that hangs instead of failing (a peer alive but unreachable) ends at the group's timeout.
"""

from __future__ import annotations

import datetime
import os
import threading

import torch

from .log import get_logger

log = get_logger()

BACKEND = "runner-elastic"
# How long a collective may wait for a peer before it counts as failed; a vanished machine sends no reset.
TIMEOUT_ENV = "RUNNER_ELASTIC_TIMEOUT_SECONDS"
DEFAULT_TIMEOUT_S = 60.0

# The collectives wrapped, and which argument holds the tensors the caller reads afterwards (0: the first).
_COLLECTIVES = {
    "allreduce": 0, "allreduce_coalesced": 0, "broadcast": 0, "allgather": 0, "_allgather_base": 0,
    "allgather_into_tensor_coalesced": 0, "allgather_coalesced": 0, "reduce_scatter": 0,
    "_reduce_scatter_base": 0, "reduce_scatter_tensor_coalesced": 0, "alltoall_base": 0, "alltoall": 0,
    "reduce": 0, "gather": 0, "scatter": 0, "barrier": None,
}


def timeout() -> datetime.timedelta:
    raw = os.environ.get(TIMEOUT_ENV)
    try:
        seconds = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        seconds = DEFAULT_TIMEOUT_S
    return datetime.timedelta(seconds=max(1.0, seconds))


def _as_if_alone(name: str, args: tuple):
    """What a failed collective hands back: the rank's own tensors; an all-gather's outputs each a copy of this
    rank's input, as if every rank had sent the same (DDP's constructor checks, by an all-gather, that every rank
    has the same parameters' shapes: garbage there raises in the user's code, as when a peer dies right after
    a change of world)."""
    slot = _COLLECTIVES[name]
    local = args[slot] if slot is not None and args else []
    try:
        if name == "allgather":
            for outputs, mine in zip(args[0], args[1]):
                for out in outputs:
                    out.copy_(mine)
        elif name == "_allgather_base":
            args[0].view(-1, *args[1].shape).copy_(args[1].unsqueeze(0))
    except Exception as exc:  # noqa: BLE001 - best effort: the group is broken anyway
        log.debug("a failed all-gather's outputs were left as they were", error=str(exc))
    return local


def _completed(value):
    from torch._C._distributed_c10d import _create_work_from_future

    future = torch.futures.Future()
    future.set_result(value)
    return _create_work_from_future(future)


class TolerantGroup(torch.distributed.ProcessGroup):
    """Forwards collectives to ``inner``; a failure is recorded (``error``) and the collective completes locally."""

    def __init__(self, inner) -> None:
        super().__init__(inner.rank(), inner.size())
        self.inner = inner
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    @property
    def broken(self) -> bool:
        return self.error is not None

    def mark_broken(self, error: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = error
                log.warning("a collective of the training's process group failed; this rank goes on alone until "
                            "the group is rebuilt", error=f"{type(error).__name__}: {str(error)[:300]}")

    def _forward(self, name: str, args: tuple):
        from torch._C._distributed_c10d import _create_work_from_future

        if self.broken:
            return _completed(_as_if_alone(name, args))
        try:
            work = getattr(self.inner, name)(*args)
        except Exception as exc:  # noqa: BLE001 - a broken transport may raise at launch too
            self.mark_broken(exc)
            return _completed(_as_if_alone(name, args))

        def settle(future):
            try:
                return future.value()
            except Exception as exc:  # noqa: BLE001 - recorded; the step's collective completes locally
                self.mark_broken(exc)
                return _as_if_alone(name, args)

        return _create_work_from_future(work.get_future().then(settle))

    def getBackendName(self) -> str:  # noqa: N802 - the ProcessGroup API's name
        return BACKEND

    def abort(self) -> None:
        """Drop the inner group without waiting for its collectives (NCCL's abort; gloo closes its pairs)."""
        try:
            self.inner.abort()
        except Exception as exc:  # noqa: BLE001 - best effort: the group is being abandoned
            log.debug("abort of the old process group failed", error=str(exc))


def _make_forwarder(name: str):
    def forward(self, *args):
        return self._forward(name, args)

    forward.__name__ = name
    return forward


for _name in _COLLECTIVES:
    setattr(TolerantGroup, _name, _make_forwarder(_name))


def _inner_group(store, rank: int, world_size: int, timeout_: datetime.timedelta):
    """The real group under the wrapper: NCCL when the training is on CUDA, else gloo."""
    import torch.distributed as dist

    if torch.cuda.is_available() and os.environ.get("RUNNER_ELASTIC_BACKEND", "nccl") == "nccl" \
            and dist.is_nccl_available():  # pragma: no cover - needs a GPU
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout_
        return dist.ProcessGroupNCCL(store, rank, world_size, options)
    return dist.ProcessGroupGloo(store, rank, world_size, timeout_)


def _create(store, rank: int, world_size: int, timeout_: datetime.timedelta):
    return TolerantGroup(_inner_group(store, rank, world_size, timeout_))


_registered = False


def register() -> None:
    """Make ``runner-elastic`` a torch.distributed backend name (once per process)."""
    global _registered
    import torch.distributed as dist

    if not _registered:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])
        _registered = True


def default_group() -> TolerantGroup | None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    group = dist.distributed_c10d._get_default_group()
    return group if isinstance(group, TolerantGroup) else None


def abandon() -> None:
    """Leave every process group of this process at once: abort the default group's backend (NCCL must not be
    waited on), then destroy them all so a new default group can be made."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    group = default_group()
    if group is not None and torch.cuda.is_available():  # pragma: no cover - needs a GPU
        group.abort()
    try:
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - whatever state it is in, the groups are gone from the registry
        log.warning("destroying the old process groups failed", error=f"{type(exc).__name__}: {exc}")


def init_default(store, rank: int, world_size: int) -> TolerantGroup:
    """Make a TolerantGroup over ``store`` the default group."""
    import torch.distributed as dist

    register()
    dist.init_process_group(BACKEND, store=store, rank=rank, world_size=world_size, timeout=timeout())
    return dist.distributed_c10d._get_default_group()
