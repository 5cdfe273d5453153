"""Read a one-process checkpoint from its folder: every byte read once, verified in the same pass, and each
tensor's bytes read straight into a tensor of its own.

A flat checkpoint is data files (parts of the staged buffer, several tensors each at aligned offsets) and
``state.pkl``, the skeleton naming where each tensor lies (staging.py). The skeleton is read and verified
first; then each data file is read front to back, every tensor's range into a fresh tensor that owns its
storage and the padding between them into a small scratch buffer, all of it through the checksum. Nothing
is handed back unless every file's size and checksum match the manifest, so a damaged or partial checkpoint
is never half-loaded; a file that changed after an earlier check is caught here, since these are the bytes
that are used.

What this saves against reading each file into a buffer and copying the tensors out (a restore of 1 GB on
a cloud's handover, benchmarks/restore_handover.py): the buffer's allocation and page faults, one copy of
every byte, and a separate hashing pass.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from .checksum import new_hasher
from .errors import CorruptCheckpointError
from .local import CHUNK, check_size, read_verified
from .manifest import STATE_NAME, Manifest
from .staging import TensorRef, byte_view, fill, load_skeleton, tensor_refs

SCRATCH = 1 << 20  # the padding between tensors is at most 63 bytes; a larger span is read through this
# Data files read at once (the reads release the GIL). On a 2-vCPU machine under load four readers were slower
# than one (their page faults contend: benchmarks/restore_handover.py); a node with cores to spare reads four.
READERS = max(1, min(4, (os.cpu_count() or 1) // 4))


def read_flat(folder: Path, manifest: Manifest, pool=None) -> dict:
    """Verify every file of ``folder`` against ``manifest`` and rebuild the saved state (see the module); the
    tensors come from ``pool`` (a warm_pool.WarmPool) where it has one of the size."""
    entries = {f["name"]: f for f in manifest.files}
    if STATE_NAME not in entries:
        raise CorruptCheckpointError(f"{folder}: the manifest lists no {STATE_NAME}")
    try:
        skeleton = load_skeleton(bytes(read_verified(folder / STATE_NAME, entries[STATE_NAME], manifest.checksum)))
    except CorruptCheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - an unpicklable skeleton is a damaged checkpoint
        raise CorruptCheckpointError(f"{folder / STATE_NAME} cannot be read: {exc}") from exc
    parts = [f for f in manifest.files if f["name"] != STATE_NAME]  # part i is the i-th data file
    refs = tensor_refs(skeleton)
    by_part: list[list[TensorRef]] = [[] for _ in parts]
    for ref in refs:
        if not isinstance(ref.part, int) or not 0 <= ref.part < len(parts):
            raise CorruptCheckpointError(f"{folder / STATE_NAME} names data part {ref.part!r}; the manifest lists "
                                         f"{len(parts)}")
        by_part[ref.part].append(ref)
    tensors: dict[int, torch.Tensor] = {}  # id(ref) -> its bytes

    def read_part(index: int) -> None:
        tensors.update(_read_part(folder / parts[index]["name"], parts[index], manifest.checksum, by_part[index],
                                  pool))

    workers = min(READERS, len(parts))
    if workers > 1:
        with ThreadPoolExecutor(workers, thread_name_prefix="checkpoint-read") as readers:
            for done in [readers.submit(read_part, i) for i in range(len(parts))]:
                done.result()  # the first damaged file's error (the others finish first: no reader left behind)
    else:
        for index in range(len(parts)):
            read_part(index)

    def tensor_of(ref: TensorRef) -> torch.Tensor:
        dtype = getattr(torch, ref.dtype)
        if ref.nbytes == 0:
            return torch.empty(ref.shape, dtype=dtype)
        return tensors[id(ref)].view(dtype).view(ref.shape)

    try:
        return fill(skeleton, tensor_of)
    except Exception as exc:  # noqa: BLE001 - a dtype or shape that does not fit its bytes: a damaged skeleton
        raise CorruptCheckpointError(f"{folder / STATE_NAME} does not describe its data files: {exc}") from exc


def _read_part(path: Path, entry: dict, algorithm: str, refs: list[TensorRef], pool=None) -> dict[int, torch.Tensor]:
    """Read one data file through its checksum, each of ``refs`` into a tensor of its own; check the size and
    checksum and that the refs lie inside the file without overlapping."""
    size = check_size(path, entry)
    hasher = new_hasher(algorithm)
    scratch = memoryview(bytearray(min(SCRATCH, size) or 1))
    out: dict[int, torch.Tensor] = {}
    with open(path, "rb", buffering=0) as f:
        cursor = 0

        def read_into(view: memoryview) -> None:
            nonlocal cursor
            got = 0
            while got < len(view):
                n = f.readinto(view[got:got + CHUNK])
                if not n:
                    raise CorruptCheckpointError(f"{path} ended after {cursor + got} of {size} bytes")
                hasher.update(view[got:got + n])
                got += n
            cursor += got

        def skip_to(offset: int) -> None:
            while cursor < offset:
                read_into(scratch[:min(len(scratch), offset - cursor)])

        for ref in sorted((r for r in refs if r.nbytes), key=lambda r: r.offset):
            if not isinstance(ref.offset, int) or not isinstance(ref.nbytes, int) or ref.offset < cursor \
                    or ref.offset + ref.nbytes > size:
                raise CorruptCheckpointError(f"{path}: the skeleton places a tensor at bytes {ref.offset!r}+"
                                             f"{ref.nbytes!r}, outside the file or over another")
            skip_to(ref.offset)
            tensor = pool.take(ref.nbytes) if pool is not None else None
            if tensor is None:
                tensor = torch.empty(ref.nbytes, dtype=torch.uint8)
            read_into(byte_view(tensor, 0, ref.nbytes))
            out[id(ref)] = tensor
        skip_to(size)
    if hasher.hexdigest() != entry["checksum"]:
        raise CorruptCheckpointError(f"{path} fails its {algorithm} checksum")
    return out
