"""ResumableSampler: a shuffling sampler whose position in the epoch survives a restart.

Exact resume needs one more thing than the position. A ``DataLoader`` draws one number from torch's global
generator each time an iterator is created (its base seed). An uninterrupted run makes that draw only
at the start of an epoch; a resumed run makes it again when it re-creates the iterator mid-epoch, which
would shift every later random draw (dropout, augmentation). So the sampler keeps torch's CPU generator
state with its position, and when a resumed iteration starts mid-epoch it puts that state back before
it yields the first index, undoing the extra draw.

Under torch.distributed (or with ``num_replicas``/``rank`` given) the sampler shards like
``DistributedSampler``: each epoch's order is padded to a multiple of the world size and rank ``r`` takes
every ``world``-th index from ``r``. Because the shards interleave, after every rank has handed out ``p``
indices the job has consumed exactly the first ``p * world`` of the order; so a restart onto another world
size goes on with the rest of that epoch, re-sharded over the new ranks (``start`` marks where).

Positions count indices handed to the DataLoader. With ``num_workers=0`` that is exactly what the
training consumed; with worker processes the DataLoader prefetches ahead, so a resume skips the batches
that were prefetched but not trained on (no sample is seen twice).
"""

from __future__ import annotations

from collections.abc import Iterator, Sized

import torch
from torch.utils.data import Sampler

_MASK = (1 << 63) - 1


class ResumableSampler(Sampler[int]):
    """Yields each index of ``range(len(data))`` once per epoch (this rank's share of it in a process group),
    shuffled by ``(seed, epoch)`` when ``shuffle``."""

    def __init__(self, dataset_or_len: Sized | int, shuffle: bool = True, seed: int = 0,
                 num_replicas: int | None = None, rank: int | None = None) -> None:
        if isinstance(dataset_or_len, bool):
            raise TypeError("ResumableSampler needs a dataset or its length, not a bool")
        length = dataset_or_len if isinstance(dataset_or_len, int) else len(dataset_or_len)
        if length < 0:
            raise ValueError(f"ResumableSampler: length {length} is negative")
        if num_replicas is None or rank is None:
            world, me = _process_group()
            num_replicas = world if num_replicas is None else num_replicas
            rank = me if rank is None else rank
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"ResumableSampler: rank {rank} is not in a world of {num_replicas}")
        self.length = length
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.epoch = 0
        self.start = 0     # where in the epoch's order this sharding began (moves after a world-size change)
        self.position = 0  # indices of this rank's shard already handed out
        self._resume_rng: torch.Tensor | None = None

    def __len__(self) -> int:
        return -(-(self.length - self.start) // self.num_replicas) if self.length > self.start else 0

    def order(self, epoch: int) -> list[int]:
        """The index order of one epoch (the whole job's, before sharding)."""
        if not self.shuffle:
            return list(range(self.length))
        generator = torch.Generator()
        generator.manual_seed((self.seed * 0x9E3779B97F4A7C15 + epoch) & _MASK)
        return torch.randperm(self.length, generator=generator).tolist()

    def shard(self, epoch: int) -> list[int]:
        """This rank's indices of the epoch, from ``start`` on, padded like DistributedSampler's."""
        rest = self.order(epoch)[self.start:]
        world = self.num_replicas
        if world > 1 and rest and len(rest) % world:
            padding = world - len(rest) % world
            rest += (rest * (padding // len(rest) + 1))[:padding]
        return rest[self.rank::world]

    def __iter__(self) -> Iterator[int]:
        if self.position >= len(self):
            self._next_epoch()
        resume_rng, self._resume_rng = self._resume_rng, None
        if resume_rng is not None and self.position > 0:
            torch.set_rng_state(resume_rng)
        shard = self.shard(self.epoch)
        while self.position < len(shard):
            index = shard[self.position]
            self.position += 1
            yield index
        self._next_epoch()

    def reshard(self, num_replicas: int, rank: int) -> None:
        """Go on with the rest of this epoch over a new world (an elastic gang's change, elastic.py): the job
        has consumed the first ``start + position * num_replicas`` of the order; the new ranks share the rest.
        Iterators made before the change are stale: make a new one (``iter(loader)``)."""
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"ResumableSampler: rank {rank} is not in a world of {num_replicas}")
        consumed = self.start + self.position * self.num_replicas
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.start, self.position, self._resume_rng = min(self.length, consumed), 0, None
        if self.start >= self.length:
            self._next_epoch()

    def _next_epoch(self) -> None:
        self.epoch, self.start, self.position = self.epoch + 1, 0, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "start": self.start,
                "num_replicas": self.num_replicas, "seed": self.seed, "length": self.length,
                "shuffle": self.shuffle, "torch_rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict) -> None:
        if state["length"] != self.length:
            raise ValueError(f"ResumableSampler: the checkpoint was taken over {state['length']} samples, "
                             f"this dataset has {self.length}; resume with the same dataset")
        self.seed, self.shuffle = int(state["seed"]), bool(state["shuffle"])
        self.epoch = int(state["epoch"])
        saved_world, start = int(state.get("num_replicas", 1)), int(state.get("start", 0))
        if saved_world == self.num_replicas:
            self.start, self.position = start, int(state["position"])
            mid_epoch = 0 < self.position < len(self)
            self._resume_rng = state.get("torch_rng") if mid_epoch else None
            return
        # Another world size: the job consumed the first start + position * saved_world of the order.
        self.start, self.position, self._resume_rng = min(self.length, start + int(state["position"]) * saved_world), 0, None
        if self.start >= self.length:
            self._next_epoch()


def _process_group() -> tuple[int, int]:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return 1, 0
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0
