"""ResumableSampler: a shuffling sampler whose position in the epoch survives a restart.

Exact resume needs one more thing than the position. A ``DataLoader`` draws one number from torch's global
generator each time an iterator is created (its base seed). An uninterrupted run makes that draw only
at the start of an epoch; a resumed run makes it again when it re-creates the iterator mid-epoch, which
would shift every later random draw (dropout, augmentation). So the sampler keeps torch's CPU generator
state with its position, and when a resumed iteration starts mid-epoch it puts that state back before
it yields the first index, undoing the extra draw.

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
    """Yields each index of ``range(len(data))`` once per epoch, shuffled by ``(seed, epoch)`` when ``shuffle``."""

    def __init__(self, dataset_or_len: Sized | int, shuffle: bool = True, seed: int = 0) -> None:
        if isinstance(dataset_or_len, bool):
            raise TypeError("ResumableSampler needs a dataset or its length, not a bool")
        length = dataset_or_len if isinstance(dataset_or_len, int) else len(dataset_or_len)
        if length < 0:
            raise ValueError(f"ResumableSampler: length {length} is negative")
        self.length = length
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0
        self.position = 0  # indices of the current epoch already handed out
        self._resume_rng: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.length

    def order(self, epoch: int) -> list[int]:
        """The index order of one epoch."""
        if not self.shuffle:
            return list(range(self.length))
        generator = torch.Generator()
        generator.manual_seed((self.seed * 0x9E3779B97F4A7C15 + epoch) & _MASK)
        return torch.randperm(self.length, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        if self.position >= self.length:
            self.epoch, self.position = self.epoch + 1, 0
        resume_rng, self._resume_rng = self._resume_rng, None
        if resume_rng is not None and self.position > 0:
            torch.set_rng_state(resume_rng)
        order = self.order(self.epoch)
        while self.position < self.length:
            index = order[self.position]
            self.position += 1
            yield index
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "length": self.length,
                "shuffle": self.shuffle, "torch_rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict) -> None:
        if state["length"] != self.length:
            raise ValueError(f"ResumableSampler: the checkpoint was taken over {state['length']} samples, "
                             f"this dataset has {self.length}; resume with the same dataset")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.seed, self.shuffle = int(state["seed"]), bool(state["shuffle"])
        self._resume_rng = state.get("torch_rng") if 0 < self.position < self.length else None
