"""Moving the training state to the ranks of a new world that lack it (elastic gangs, docs/elastic.md).

After a change of world every rank must hold the same registered state. Who lacks it decides what moves:

* survivors of a notice hold it already (every step they trained was all-reduced): nothing moves;
* a joining rank holds none: a survivor sends it, point to point (joiners are spread over the survivors);
* after a loss the survivors may differ by the step trained on their own gradients: the lowest surviving
  rank broadcasts it to every other rank.

The state is the registered objects' ``state_dict()`` and ``extra``. It travels as a small pickled
*skeleton* (everything but the tensors, and each tensor's place, dtype and shape) followed by the tensors'
raw bytes. A receiver takes each tensor straight into its own tensor at the same place of its own
``state_dict()`` when that one matches (a model's parameters: no copy and no new memory), otherwise into a
new one (the optimizer's buffers a fresh process has not made yet); tensors under ``SMALL`` bytes travel
packed into buckets, so a model of many small tensors costs few messages. Each object's
``load_state_dict()`` then takes the result, as from a checkpoint (loading a tensor onto itself is free).

Everything goes over the library's gloo side group, on CPU: a CUDA tensor is staged through host memory on
both ends, so no NCCL collective is ever waited on here.
"""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass

import torch

SMALL = 1 << 20        # tensors below this many bytes travel packed into buckets
BUCKET = 16 << 20      # the most bytes a bucket of small tensors holds (a larger tensor goes alone)
_ALIGN = 16            # a packed tensor starts at a multiple of this (viewing bytes as a dtype needs it)


@dataclass(frozen=True)
class _Ref:
    """Where a tensor stood in the skeleton: the index of its TensorSpec."""

    index: int


@dataclass(frozen=True)
class TensorSpec:
    path: tuple
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = 1
        for n in self.shape:
            count *= n
        return count * torch.empty((), dtype=self.dtype).element_size()


def _movable(value) -> bool:
    """A plain dense tensor whose bytes can be sent as they are (subclasses, sparse, quantized and meta
    tensors ride in the pickled skeleton instead)."""
    return (type(value) in (torch.Tensor, torch.nn.Parameter) and value.layout == torch.strided
            and not value.is_quantized and value.device.type != "meta")


def strip(tree, path: tuple = ()) -> tuple[object, list[torch.Tensor], list[TensorSpec]]:
    """(skeleton, tensors, specs): ``tree`` with each movable tensor replaced by a ``_Ref``."""
    tensors: list[torch.Tensor] = []
    specs: list[TensorSpec] = []

    def walk(node, where):
        if isinstance(node, torch.Tensor):
            if not _movable(node):
                return node
            specs.append(TensorSpec(where, node.dtype, tuple(node.shape)))
            tensors.append(node)
            return _Ref(len(specs) - 1)
        if isinstance(node, dict):
            out = copy.copy(node)  # keeps the mapping's type and attributes (a module's _metadata)
            for key, value in node.items():
                out[key] = walk(value, where + (key,))
            return out
        if isinstance(node, list):
            return [walk(value, where + (i,)) for i, value in enumerate(node)]
        if type(node) is tuple:
            return tuple(walk(value, where + (i,)) for i, value in enumerate(node))
        return node

    return walk(tree, path), tensors, specs


def tensors_by_path(tree, path: tuple = ()) -> dict[tuple, torch.Tensor]:
    """Every movable tensor of ``tree`` by its place, as ``strip`` names places."""
    found: dict[tuple, torch.Tensor] = {}

    def walk(node, where):
        if isinstance(node, torch.Tensor):
            if _movable(node):
                found[where] = node
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(value, where + (key,))
        elif isinstance(node, list) or type(node) is tuple:
            for i, value in enumerate(node):
                walk(value, where + (i,))

    walk(tree, path)
    return found


def fill(skeleton, tensors: list[torch.Tensor]):
    """The tree ``strip`` took apart, with ``tensors`` in the places of its refs."""
    if isinstance(skeleton, _Ref):
        return tensors[skeleton.index]
    if isinstance(skeleton, dict):
        out = copy.copy(skeleton)
        for key, value in skeleton.items():
            out[key] = fill(value, tensors)
        return out
    if isinstance(skeleton, list):
        return [fill(value, tensors) for value in skeleton]
    if type(skeleton) is tuple:
        return tuple(fill(value, tensors) for value in skeleton)
    return skeleton


def plan(specs: list[TensorSpec]) -> list[list[int]]:
    """The messages, in order: a large tensor alone, small ones packed in buckets (the same on both ends)."""
    messages: list[list[int]] = []
    bucket: list[int] = []
    size = 0
    for i, spec in enumerate(specs):
        if spec.nbytes == 0:
            continue
        if spec.nbytes >= SMALL:
            messages.append([i])
            continue
        if bucket and size + spec.nbytes > BUCKET:
            messages.append(bucket)
            bucket, size = [], 0
        bucket.append(i)
        size += _padded(spec.nbytes)
    if bucket:
        messages.append(bucket)
    return messages


def _padded(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor's bytes, as a 1-d uint8 view (no copy)."""
    return tensor.detach().reshape(-1).view(torch.uint8)


def _host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s data as a contiguous CPU tensor (itself when it is one already)."""
    return tensor.detach().to("cpu").contiguous()


def _fits(target, spec: TensorSpec) -> bool:
    """Whether a receiver's own tensor can take the incoming one's bytes in place."""
    return (isinstance(target, torch.Tensor) and target.device.type == "cpu" and target.dtype == spec.dtype
            and tuple(target.shape) == spec.shape and target.is_contiguous())


class Link:
    """How the bytes go from the sending rank: ``send`` on it, ``recv`` on a receiver (collective or p2p)."""

    def send(self, tensor: torch.Tensor) -> None:
        raise NotImplementedError

    def recv(self, tensor: torch.Tensor) -> None:
        raise NotImplementedError


class Broadcast(Link):
    def __init__(self, group, source: int) -> None:
        self.group, self.source = group, source

    def send(self, tensor: torch.Tensor) -> None:
        import torch.distributed as dist

        dist.broadcast(tensor, src=self.source, group=self.group)

    recv = send


class PointToPoint(Link):
    def __init__(self, group, peer: int) -> None:
        self.group, self.peer = group, peer

    def send(self, tensor: torch.Tensor) -> None:
        import torch.distributed as dist

        dist.send(tensor, dst=self.peer, group=self.group)

    def recv(self, tensor: torch.Tensor) -> None:
        import torch.distributed as dist

        dist.recv(tensor, src=self.peer, group=self.group)


def send_state(link: Link, state: dict) -> int:
    """Send ``state`` (a tree of dicts, lists and tensors); the bytes sent."""
    skeleton, tensors, specs = strip(state)
    blob = pickle.dumps((skeleton, specs), protocol=pickle.HIGHEST_PROTOCOL)
    link.send(torch.tensor([len(blob)], dtype=torch.int64))
    link.send(torch.frombuffer(bytearray(blob), dtype=torch.uint8))
    sent = len(blob)
    for message in plan(specs):
        if len(message) == 1 and specs[message[0]].nbytes >= SMALL:
            data = _host(tensors[message[0]])
            link.send(_bytes(data))
            sent += data.nbytes
            continue
        bucket = torch.empty(sum(_padded(specs[i].nbytes) for i in message), dtype=torch.uint8)
        offset = 0
        for i in message:
            size = specs[i].nbytes
            bucket[offset:offset + size].copy_(_bytes(_host(tensors[i])))
            offset += _padded(size)
        link.send(bucket)
        sent += bucket.numel()
    return sent


def receive_state(link: Link, own: dict) -> dict:
    """Receive a state ``send_state`` sends, into ``own``'s tensors where they match (see the module's doc)."""
    length = torch.zeros(1, dtype=torch.int64)
    link.recv(length)
    blob = torch.empty(int(length.item()), dtype=torch.uint8)
    link.recv(blob)
    skeleton, specs = pickle.loads(blob.numpy().tobytes())
    mine = {path: tensor.detach() for path, tensor in tensors_by_path(own).items()}  # same storage, no autograd
    tensors: list[torch.Tensor | None] = [None] * len(specs)
    for i, spec in enumerate(specs):
        if spec.nbytes == 0:
            tensors[i] = torch.empty(spec.shape, dtype=spec.dtype)
    for message in plan(specs):
        if len(message) == 1 and specs[message[0]].nbytes >= SMALL:
            i = message[0]
            target = mine.get(specs[i].path)
            into = target if _fits(target, specs[i]) else torch.empty(specs[i].shape, dtype=specs[i].dtype)
            link.recv(_bytes(into))
            tensors[i] = into
            continue
        bucket = torch.empty(sum(_padded(specs[i].nbytes) for i in message), dtype=torch.uint8)
        link.recv(bucket)
        offset = 0
        for i in message:
            spec = specs[i]
            value = bucket[offset:offset + spec.nbytes].view(spec.dtype).view(spec.shape)
            target = mine.get(spec.path)
            if _fits(target, spec):
                tensors[i] = target.copy_(value)
            else:
                tensors[i] = value.clone()  # not a view: the bucket is freed
            offset += _padded(spec.nbytes)
    return fill(skeleton, tensors)
