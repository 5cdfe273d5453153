"""Phase one of a save: copy every tensor of the state into one reused host buffer, and pickle the rest.

The state (a nest of dicts, lists and tuples) is flattened into a skeleton in which each tensor is replaced
by a ``TensorRef``; the tensors' bytes go to one host buffer, split into parts of at most ``part_bytes``
(one file each, uploaded in parallel). The buffer is allocated once, pinned when CUDA tensors are staged,
and reused by every later save while it is big enough. GPU tensors are copied on a side CUDA stream that
first waits for the training stream; ``stage`` synchronises that stream before it returns, so the
training may change its tensors as soon as ``stage`` is back.
"""

from __future__ import annotations

import copy
import ctypes
import io
import pickle
from dataclasses import dataclass

import torch

ALIGN = 64
DEFAULT_PART_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor lives in the data parts."""

    part: int
    offset: int
    nbytes: int
    dtype: str
    shape: tuple
    device: str


@dataclass(frozen=True)
class SavedTensor:
    """A tensor that is not a plain strided one, as ``torch.save`` bytes (loaded with ``weights_only=True``)."""

    data: bytes
    device: str


@dataclass
class Staged:
    """A staged state: the pickled skeleton and the parts' bytes (views of the reused buffer)."""

    skeleton: bytes
    parts: list[memoryview]

    @property
    def nbytes(self) -> int:
        return len(self.skeleton) + sum(len(p) for p in self.parts)


def _plain_tensor(value) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and type(value) in (torch.Tensor, torch.nn.Parameter)
        and value.layout == torch.strided
        and not value.is_quantized
        and value.device.type in ("cpu", "cuda")
    )


def _flatten(value, tensors: list):
    """Return the skeleton of ``value`` with plain tensors replaced by their index in ``tensors``."""
    if _plain_tensor(value):
        tensors.append(value)
        return _Slot(len(tensors) - 1)
    if isinstance(value, (dict, list)) or type(value) is tuple:
        return map_container(value, lambda v: _flatten(v, tensors))
    if isinstance(value, torch.Tensor):  # sparse, quantized, subclasses: torch.save'd whole, from a CPU copy
        buffer = io.BytesIO()
        torch.save(value.detach().to("cpu", copy=True), buffer)
        return SavedTensor(buffer.getvalue(), str(value.device))
    return value


def map_container(node, fn):
    """Apply ``fn`` to each value of a dict, list or plain tuple, keeping the container's type and attributes
    (a module's state_dict is an OrderedDict whose ``_metadata`` load_state_dict reads)."""
    if isinstance(node, dict):
        out = {} if type(node) is dict else copy.copy(node)
        for key, value in node.items():
            out[key] = fn(value)
        return out
    if isinstance(node, list):
        return [fn(v) for v in node]
    return tuple(fn(v) for v in node)


class _Slot:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _fill(skeleton, refs: list[TensorRef]):
    if isinstance(skeleton, _Slot):
        return refs[skeleton.index]
    if isinstance(skeleton, (dict, list)) or type(skeleton) is tuple:
        return map_container(skeleton, lambda v: _fill(v, refs))
    return skeleton


def _layout(tensors: list[torch.Tensor], part_bytes: int) -> tuple[list[TensorRef], list[tuple[int, int]], list[int]]:
    """Assign each tensor a part and an aligned offset; return refs, part (start, end) in the buffer, buffer offsets."""
    refs, parts, starts = [], [], []
    part_start = cursor = 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if cursor > part_start and cursor + nbytes - part_start > part_bytes:
            parts.append((part_start, cursor))
            part_start = cursor
        refs.append(TensorRef(len(parts), cursor - part_start, nbytes, str(tensor.dtype).removeprefix("torch."),
                              tuple(tensor.shape), str(tensor.device)))
        starts.append(cursor)
        cursor += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    if cursor > part_start:
        parts.append((part_start, cursor))
    return refs, parts, starts


def byte_view(buffer: torch.Tensor, start: int, end: int) -> memoryview:
    """A zero-copy memoryview of ``buffer[start:end]`` (a CPU uint8 tensor); needs no NumPy."""
    if end <= start:
        return memoryview(b"")
    raw = (ctypes.c_char * (end - start)).from_address(buffer.data_ptr() + start)
    return memoryview(raw).cast("B")


class Stager:
    """Copies state into a host buffer that is allocated once and reused."""

    def __init__(self, part_bytes: int = DEFAULT_PART_BYTES) -> None:
        self.part_bytes = part_bytes
        self._buffer: torch.Tensor | None = None
        self._streams: dict[torch.device, object] = {}

    def stage(self, state) -> Staged:
        """Copy ``state`` into the buffer; when this returns, the training may modify its tensors."""
        tensors: list[torch.Tensor] = []
        skeleton = _flatten(state, tensors)
        refs, parts, starts = _layout(tensors, self.part_bytes)
        total = parts[-1][1] if parts else 0
        on_cuda = any(t.is_cuda for t in tensors)
        buffer = self._ensure_buffer(total, pin=on_cuda)
        cuda_devices = {t.device for t in tensors if t.is_cuda}
        for device in cuda_devices:
            self._stream(device).wait_stream(torch.cuda.current_stream(device))
        with torch.no_grad():
            for tensor, ref, start in zip(tensors, refs, starts):
                if ref.nbytes == 0:
                    continue
                dst = buffer[start:start + ref.nbytes].view(tensor.dtype).view(tensor.shape)
                if tensor.is_cuda:
                    with torch.cuda.stream(self._stream(tensor.device)):
                        dst.copy_(tensor.detach(), non_blocking=True)
                else:
                    dst.copy_(tensor.detach())
        for device in cuda_devices:
            self._stream(device).synchronize()
        pickled = pickle.dumps(_fill(skeleton, refs), protocol=pickle.HIGHEST_PROTOCOL)
        return Staged(pickled, [byte_view(buffer, s, e) for s, e in parts])

    def _ensure_buffer(self, nbytes: int, pin: bool) -> torch.Tensor:
        buffer = self._buffer
        pinned = buffer is not None and buffer.is_pinned()
        if buffer is None or buffer.numel() < nbytes or (pin and not pinned):
            self._buffer = None  # let the old one go before allocating the new one
            capacity = max(nbytes + nbytes // 16, 1)
            pin = pin and torch.cuda.is_available()
            self._buffer = torch.empty(capacity, dtype=torch.uint8, pin_memory=pin)
        return self._buffer

    def _stream(self, device: torch.device):
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device=device)
        return self._streams[device]


class SkeletonUnpickler(pickle.Unpickler):
    """Unpickles a skeleton without running code: only plain containers, our refs and NumPy arrays.

    A checkpoint may come from a bucket someone else can write to; ``pickle.loads`` would run whatever a
    forged ``state.pkl`` names. Anything outside this list is refused, naming it.
    """

    ALLOWED = {
        ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"),
        ("builtins", "complex"), ("builtins", "bytearray"), ("builtins", "range"),
        ("runner.checkpoint.staging", "TensorRef"), ("runner.checkpoint.staging", "SavedTensor"),
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
        ("torch", "Size"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) in self.ALLOWED or (module.startswith("numpy") and name.endswith("DType")):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"the checkpoint's state names {module}.{name}, which a checkpoint may not "
                                     f"load (it could run code); only plain values, tensors and NumPy arrays")


def load_skeleton(skeleton_bytes: bytes):
    """Unpickle a skeleton safely (SkeletonUnpickler): plain containers with TensorRef/SavedTensor leaves."""
    return SkeletonUnpickler(io.BytesIO(skeleton_bytes)).load()


def tensor_refs(skeleton) -> list[TensorRef]:
    """Every TensorRef of a skeleton, in the order ``fill`` visits them."""
    refs: list[TensorRef] = []

    def walk(node):
        if isinstance(node, TensorRef):
            refs.append(node)
        elif isinstance(node, (dict, list)) or type(node) is tuple:
            for value in (node.values() if isinstance(node, dict) else node):
                walk(value)

    walk(skeleton)
    return refs


def fill(skeleton, tensor_of):
    """The state a skeleton describes: each TensorRef replaced by ``tensor_of(ref)`` (a CPU tensor of its dtype
    and shape), moved to its CUDA device when it was saved from one and CUDA is here; SavedTensors loaded."""
    cuda = torch.cuda.is_available()

    def walk(node):
        if isinstance(node, TensorRef):
            tensor = tensor_of(node)
            return tensor.to(node.device) if node.device.startswith("cuda") and cuda else tensor
        if isinstance(node, SavedTensor):
            tensor = torch.load(io.BytesIO(node.data), weights_only=True)
            return tensor.to(node.device) if node.device.startswith("cuda") and cuda else tensor
        if isinstance(node, (dict, list)) or type(node) is tuple:
            return map_container(node, walk)
        return node

    return walk(skeleton)
