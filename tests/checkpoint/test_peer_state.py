"""How an elastic gang's state travels to a rank that lacks it (runner/checkpoint/peer_state.py): a skeleton and
raw tensor bytes, taken into the receiver's own tensors where they match. The link here is an in-process queue;
tests/checkpoint/test_elastic.py moves it between real gloo processes."""

from __future__ import annotations

import queue
from collections import OrderedDict

import pytest
import torch
from torch import nn

from runner.checkpoint import peer_state


class QueueLink(peer_state.Link):
    """Both ends in one process: what one sends, the other receives, message by message."""

    def __init__(self) -> None:
        self.messages: queue.Queue = queue.Queue()
        self.sizes: list[int] = []

    def send(self, tensor: torch.Tensor) -> None:
        self.sizes.append(tensor.numel())
        self.messages.put(tensor.clone())

    def recv(self, tensor: torch.Tensor) -> None:
        sent = self.messages.get_nowait()
        assert sent.dtype == tensor.dtype and sent.shape == tensor.shape
        tensor.copy_(sent)


def trained(seed: int):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(300, 1000), nn.ReLU(), nn.Linear(1000, 4), nn.BatchNorm1d(4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(2):
        model(torch.randn(8, 300)).square().mean().backward()
        optimizer.step()
    return model, optimizer


def same(a, b) -> bool:
    """Bitwise equal trees (tensors equal in dtype, shape and every bit)."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_a_fresh_process_gets_the_whole_state_bitwise_into_its_own_parameters():
    """The joiner's model and optimizer end bitwise equal to the sender's; the parameters' bytes land in the
    joiner's own parameter storage (no second copy), and the optimizer state it had not made yet is made."""
    model, optimizer = trained(0)
    torch.manual_seed(1)
    fresh = nn.Sequential(nn.Linear(300, 1000), nn.ReLU(), nn.Linear(1000, 4), nn.BatchNorm1d(4))
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=1e-3)
    storage = {name: p.data_ptr() for name, p in fresh.named_parameters()}
    link = QueueLink()
    sent = {"objects": {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "extra": {"tokens": 7}}
    peer_state.send_state(link, sent)
    own = {"objects": {"model": fresh.state_dict(), "optimizer": fresh_optimizer.state_dict()}, "extra": {}}
    got = peer_state.receive_state(link, own)
    assert link.messages.empty()
    fresh.load_state_dict(got["objects"]["model"])
    fresh_optimizer.load_state_dict(got["objects"]["optimizer"])
    assert same(fresh.state_dict(), model.state_dict())
    assert same(fresh_optimizer.state_dict(), optimizer.state_dict())
    assert got["extra"] == {"tokens": 7}
    assert {name: p.data_ptr() for name, p in fresh.named_parameters()} == storage
    # 27 tensors in 6 messages: the skeleton's length and bytes, the big weight and its two Adam moments
    # alone (1.2 MB each), and the 24 small ones (biases, Adam's steps, BatchNorm's buffers) in one bucket.
    assert link.sizes.count(300 * 1000 * 4) == 3 and len(link.sizes) == 6


def test_parameters_themselves_are_filled_in_place():
    """An object whose state_dict() hands out its parameters as they are (requiring grad) gets the bytes in them."""
    model, _ = trained(0)
    fresh = trained(1)[0]
    link = QueueLink()
    peer_state.send_state(link, model.state_dict(keep_vars=True))
    got = peer_state.receive_state(link, fresh.state_dict(keep_vars=True))
    assert same(fresh.state_dict(), model.state_dict())
    assert got["0.weight"].data_ptr() == fresh[0].weight.data_ptr()


def test_what_is_not_a_plain_tensor_still_arrives():
    """Mapping types and their attributes, tuples, empty and 0-d tensors, bools, non-contiguous views and
    sparse tensors (in the pickled skeleton) all come out as they went in."""
    mapping = OrderedDict(w=torch.arange(12.0).reshape(3, 4).t())  # a non-contiguous view
    mapping._metadata = {"": {"version": 2}}
    state = {"m": mapping, "t": (torch.tensor(3, dtype=torch.int64), "word", None),
             "flags": [torch.tensor([True, False, True]), torch.empty(0, 5)],
             "sparse": torch.eye(3).to_sparse(), "big": torch.randn(300_000, dtype=torch.float64),
             "half": torch.randn(7, dtype=torch.bfloat16)}
    link = QueueLink()
    peer_state.send_state(link, state)
    got = peer_state.receive_state(link, {})
    assert got["m"]._metadata == {"": {"version": 2}} and type(got["m"]) is OrderedDict
    assert same({k: v for k, v in got.items() if k != "sparse"}, {k: v for k, v in state.items() if k != "sparse"})
    assert torch.equal(got["sparse"].to_dense(), torch.eye(3))


def test_a_tensor_of_another_shape_at_the_same_place_is_not_overwritten():
    """The receiver's own tensor is used only when it matches; otherwise a new one is made (and the old
    one is left as it was)."""
    link = QueueLink()
    peer_state.send_state(link, {"a": torch.ones(2_000_000), "b": torch.ones(3)})
    mine_a, mine_b = torch.zeros(1_000_000), torch.zeros(3, dtype=torch.float64)
    got = peer_state.receive_state(link, {"a": mine_a, "b": mine_b})
    assert got["a"].shape == (2_000_000,) and got["a"].data_ptr() != mine_a.data_ptr() and not mine_a.any()
    assert got["b"].dtype == torch.float32 and not mine_b.any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_state_is_staged_through_host_memory():  # pragma: no cover - needs a GPU
    """GPU tensors leave as host bytes and arrive on the host; load_state_dict puts them on the GPU."""
    model, _ = trained(0)
    model = model.cuda()
    fresh = trained(1)[0].cuda()
    link = QueueLink()
    peer_state.send_state(link, {"model": model.state_dict()})
    got = peer_state.receive_state(link, {"model": fresh.state_dict()})
    fresh.load_state_dict(got["model"])
    assert same(fresh.state_dict(), model.state_dict())
