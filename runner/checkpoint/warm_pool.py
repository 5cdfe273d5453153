"""Memory for the restore, made ready while a process started ahead waits for its handover.

A restore reads every tensor into memory of its own (flat_read.py). On a fresh process that memory is new
to the kernel: each page faults in as it is first written, which costs about as much as reading the bytes
(a third of a second per GB on a cloud VM's vCPU). A process started ahead of its attempt
(resume_wait.py) has time to spare before the handover; the step it will restore is usually not there yet
(the emergency checkpoint is still uploading), but its tensors have the sizes of the newest checkpoint on
the node, which the prefetch copied during setup. So, while it waits, this allocates and touches one
tensor per tensor of that checkpoint, and the restore reads into those instead of fresh ones.

Only sizes are taken from the checkpoint found here (its skeleton unpickled as safely as a restore does);
no byte of it is used. A tensor is handed out once, for an exact size; what is left over is freed with the
pool. Nothing here decides what is restored, nor checks anything: the restore verifies as always.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path

import torch

from .local import LocalTier
from .log import get_logger
from .manifest import STATE_NAME
from .staging import load_skeleton, tensor_refs

log = get_logger()

SKELETON_LIMIT = 64 << 20  # a state.pkl larger than this is not a skeleton worth reading ahead
TOUCH_CHUNK = 64 << 20  # touched this much at a time, so that ``stop`` is seen within milliseconds


class WarmPool:
    """Tensors allocated and touched ahead, handed out by size (see the module)."""

    def __init__(self) -> None:
        self._free: dict[int, list[torch.Tensor]] = defaultdict(list)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.bytes = 0  # touched and not handed out yet

    def start(self, local: LocalTier) -> WarmPool:
        """Fill the pool in the background from the newest checkpoint folder of ``local`` that has a skeleton."""
        self._thread = threading.Thread(target=self._fill, args=(local,), name="checkpoint-warm-pool", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop filling (what is touched stays usable) and wait for the filler to end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def join(self, timeout: float | None = None) -> None:
        """Wait until the pool is filled (or the filler gave up), at most ``timeout`` seconds."""
        if self._thread is not None:
            self._thread.join(timeout)

    def take(self, nbytes: int) -> torch.Tensor | None:
        """A touched uint8 tensor of exactly ``nbytes``, or None."""
        with self._lock:
            free = self._free.get(nbytes)
            if not free:
                return None
            self.bytes -= nbytes
            return free.pop()

    def _fill(self, local: LocalTier) -> None:
        try:
            sizes = newest_tensor_sizes(local)
            for nbytes in sizes:
                if self._stop.is_set():
                    return
                tensor = torch.empty(nbytes, dtype=torch.uint8)
                for start in range(0, nbytes, TOUCH_CHUNK):
                    if self._stop.is_set():
                        return  # partly touched: not handed out (the restore would fault the rest anyway)
                    tensor[start:start + TOUCH_CHUNK].zero_()
                with self._lock:
                    self._free[nbytes].append(tensor)
                    self.bytes += nbytes
            if sizes:
                log.info("memory for the restore made ready while waiting", tensors=len(sizes),
                         mb=round(self.bytes / 1e6, 1))
        except Exception as exc:  # noqa: BLE001 - only a speed-up: the restore allocates what it lacks
            log.debug("no memory made ready for the restore", error=f"{type(exc).__name__}: {exc}")


def newest_tensor_sizes(local: LocalTier) -> list[int]:
    """The byte sizes of the tensors of the newest checkpoint folder here that holds a readable skeleton
    (committed, or prefetched and not yet committed), largest first; [] when there is none."""
    for _, folder in local.folders():
        path = Path(folder) / STATE_NAME
        try:
            if not path.is_file() or path.stat().st_size > SKELETON_LIMIT:
                continue
            refs = tensor_refs(load_skeleton(path.read_bytes()))
        except Exception:  # noqa: BLE001 - partly copied, another layout, damaged: try an older one
            continue
        return sorted((r.nbytes for r in refs if isinstance(r.nbytes, int) and r.nbytes > 0), reverse=True)
    return []
