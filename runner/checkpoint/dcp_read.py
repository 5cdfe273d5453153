"""Read a DCP checkpoint's tensors straight into the tensors they restore, several files at a time.

torch.distributed.checkpoint's file reader loads every stored tensor with ``torch.load``: each into memory of
its own, new to the kernel (every page faults in as it is written), then copies it into the model's tensor, one
file after another. On a restore of 1 GB per rank that is most of the time (2.4 s of 2.9 s, from a tmpfs on a
2-vCPU machine): the bytes are read into fresh pages once and copied a second time.

Each stored tensor is one ``torch.save`` archive inside a ``.distcp`` file, its bytes uncompressed at a known
offset. So this reads only the archive's small pickle (its storages stood in for by ``meta`` ones: the tensor's
dtype, shape, strides and offset, no data, nothing else built) and reads the bytes the load needs with
``os.preadv`` straight into the target tensor's memory, when that is a contiguous CPU tensor of the stored dtype
and shape; into one reused buffer, then copied, otherwise (a GPU tensor, another dtype, a view). Files are read
by a few threads at once (``preadv`` lets others run meanwhile, on cores and disks that can serve them).

Whatever this does not recognise (a transformed stream, a stored tensor that is not one contiguous range, an
archive of another byte order) goes to DCP's own reader unchanged. Nothing here verifies: the restore checked
every file's size and checksum before the load (restore.py), and a short read is an error.
"""

from __future__ import annotations

import io
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from .errors import CorruptCheckpointError, RestoreError

READ_THREADS = 4  # files read at once; more buys nothing on a node's local disk
PREAD_CHUNK = 256 << 20  # bytes one preadv call asks for (a larger one may be cut short by the kernel anyway)


class _Skeleton:
    """A stored tensor's layout: ``tensor`` on the meta device, and where its storage's bytes begin in the file."""

    def __init__(self, tensor: torch.Tensor, data_offset: int):
        self.tensor = tensor
        self.data_offset = data_offset


def _skeleton(fd: int, start: int, length: int) -> _Skeleton | None:
    """The layout of the ``torch.save`` archive at [start, start+length) of the file; None where it is not a
    plain tensor over one storage in this machine's byte order."""
    from torch import _weights_only_unpickler

    archive = _FileRange(fd, start, length)
    reader = torch._C.PyTorchFileReader(archive)
    if reader.has_record("byteorder") and reader.get_record("byteorder").decode() != sys.byteorder:
        return None
    keys = []

    def persistent_load(saved_id):
        _, storage_type, key, _, numel = saved_id
        dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
        keys.append(key)
        meta = torch.UntypedStorage(numel * torch._utils._element_size(dtype), device="meta")
        return torch.storage.TypedStorage(wrap_storage=meta, dtype=dtype, _internal=True)

    unpickler = _weights_only_unpickler.Unpickler(io.BytesIO(reader.get_record("data.pkl")), encoding="utf-8")
    unpickler.persistent_load = persistent_load
    tensor = unpickler.load()
    if type(tensor) is not torch.Tensor or len(set(keys)) != 1 or tensor.device.type != "meta":
        return None
    return _Skeleton(tensor, start + reader.get_record_offset(f"data/{keys[0]}"))


class _FileRange(io.RawIOBase):
    """A read-only, seekable view of [start, start+length) of an open file, for the archive reader."""

    def __init__(self, fd: int, start: int, length: int):
        super().__init__()
        self._fd, self._start, self._length, self._at = fd, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._length}[whence]
        self._at = max(0, base + offset)
        return self._at

    def readinto(self, buffer) -> int:
        count = max(0, min(len(buffer), self._length - self._at))
        got = os.preadv(self._fd, [memoryview(buffer)[:count]], self._start + self._at) if count else 0
        self._at += got
        return got


def _read_exactly(fd: int, into: torch.Tensor, offset: int, path: str) -> None:
    """Fill the contiguous CPU tensor ``into`` with the file's bytes from ``offset`` on."""
    view = memoryview(into.view(-1).view(torch.uint8).numpy())
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:done + PREAD_CHUNK]], offset + done)
        if got <= 0:
            raise CorruptCheckpointError(f"{path} ends {len(view) - done} bytes before a tensor it should hold")
        done += got


class _Scratch:
    """One thread's reused buffer for a tensor that cannot be read into directly (its pages fault in once)."""

    def __init__(self) -> None:
        self._buffer = torch.empty(0, dtype=torch.uint8)

    def tensor_like(self, like: torch.Tensor) -> torch.Tensor:
        nbytes = like.numel() * like.element_size()
        if self._buffer.numel() < nbytes:
            self._buffer = torch.empty(nbytes, dtype=torch.uint8)
        return self._buffer[:nbytes].view(like.dtype).view(like.shape)


def read_tensors(path: str, requests: list, storage_info, planner, fallback: list) -> None:
    """Read every tensor request of the file at ``path`` that this can (see the module); append the others, and any
    whose archive it does not recognise, to ``fallback`` for DCP's reader."""
    from torch.distributed._shard._utils import narrow_tensor_by_index as narrow
    from torch.distributed.checkpoint.planner import LoadItemType

    scratch = _Scratch()
    fd = os.open(path, os.O_RDONLY)
    try:
        for request in sorted(requests, key=lambda r: storage_info[r.storage_index].offset):
            info = storage_info[request.storage_index]
            if request.type == LoadItemType.BYTE_IO or info.transform_descriptors:
                fallback.append(request)
                continue
            try:
                skeleton = _skeleton(fd, info.offset, info.length)
            except Exception as exc:  # noqa: BLE001 - the archive reader's and the unpickler's errors alike
                raise CorruptCheckpointError(f"{path}: the tensor stored at byte {info.offset} cannot be read "
                                             f"({type(exc).__name__}: {str(exc).splitlines()[0]})") from exc
            if skeleton is None:
                fallback.append(request)
                continue
            stored = narrow(skeleton.tensor, request.storage_offsets, request.lengths)
            if not stored.is_contiguous():
                fallback.append(request)
                continue
            target = planner.resolve_tensor(request).detach()
            if target.size() != stored.size():
                raise RestoreError(f"{path}: a stored tensor is {tuple(stored.size())}, the one it restores "
                                   f"{tuple(target.size())}")
            direct = target.device.type == "cpu" and target.dtype == stored.dtype and target.is_contiguous()
            into = target if direct else scratch.tensor_like(stored)
            if stored.numel():
                _read_exactly(fd, into, skeleton.data_offset + stored.storage_offset() * stored.element_size(), path)
            if not direct:
                target.copy_(into)
            planner.commit_tensor(request, target)
    finally:
        os.close(fd)


def read_data(reader, plan, planner, read_with_dcp) -> None:
    """A FileSystemReader's ``read_data`` over ``plan``: the files read by up to READ_THREADS threads, what this
    does not read handed to ``read_with_dcp(plan)`` (DCP's own reader) afterwards."""
    from torch.distributed.checkpoint.planner import LoadPlan

    per_file: dict[str, list] = {}
    for request in plan.items:
        per_file.setdefault(reader.storage_data[request.storage_index].relative_path, []).append(request)
    fallback: list = []
    lock = threading.Lock()

    def read_file(relative_path: str) -> None:
        mine: list = []
        read_tensors(str(reader.fs.concat_path(reader.path, relative_path)), per_file[relative_path],
                     reader.storage_data, planner, mine)
        with lock:
            fallback.extend(mine)

    threads = min(READ_THREADS, len(per_file))
    if threads > 1:
        with ThreadPoolExecutor(threads, thread_name_prefix="dcp-read") as pool:
            for done in [pool.submit(read_file, name) for name in per_file]:
                done.result()
    else:
        for name in per_file:
            read_file(name)
    if fallback:
        read_with_dcp(LoadPlan(fallback))
