"""A one-process restore reads every file once, verified as it is read (flat_read.py), into memory that a
process started ahead may have made ready while it waited (warm_pool.py); what it restores is still exactly
the checkpoint, and a damaged one is still never loaded."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest
import torch

from runner.checkpoint import Checkpointer
from runner.checkpoint.checksum import digest
from runner.checkpoint.errors import CorruptCheckpointError
from runner.checkpoint.local import LocalTier
from runner.checkpoint.restore import read_folder
from runner.checkpoint.staging import TensorRef, load_skeleton
from runner.checkpoint.warm_pool import WarmPool, newest_tensor_sizes

from .conftest import same


class Holder:
    """Any state: tensors of every kind the staging writes, nested in plain containers."""

    def __init__(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.state = {
            "f32": torch.rand(1000, generator=g),
            "f16": torch.rand(3, 5, generator=g).half(),
            "bf16": torch.rand(7, generator=g).bfloat16(),
            "i64": torch.randint(-2**40, 2**40, (9,), generator=g),
            "bool": torch.rand(13, generator=g) > 0.5,
            "u8": torch.randint(0, 255, (1,), dtype=torch.uint8, generator=g),  # shorter than the alignment
            "c64": torch.complex(torch.rand(4, generator=g), torch.rand(4, generator=g)),
            "scalar": torch.tensor(float(seed)),
            "empty": torch.empty(0, 3),
            "strided": torch.rand(6, 4, generator=g).t(),  # not contiguous
            "nested": [{"a": torch.rand(2, 2, generator=g)}, (torch.arange(5), "text", 3)],
        }

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        self.state = state


def _flat(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flat(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flat(v)]
    return [value]


def _equal(a, b) -> bool:
    fa, fb = _flat(a), _flat(b)
    return len(fa) == len(fb) and all(
        (isinstance(x, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y))
        or (not isinstance(x, torch.Tensor) and x == y) for x, y in zip(fa, fb))


def test_every_kind_of_tensor_comes_back_bit_exact_in_memory_of_its_own(tmp_path):
    """Dtypes of every width, a tensor shorter than the padding, a scalar, an empty and a transposed one, nested
    containers: restored equal, and each restored tensor owns exactly its bytes (an optimizer keeps what it is
    given: a view of a bigger read buffer would keep it all alive, and torch.save would write it all)."""
    saved = Holder(seed=1)
    with Checkpointer(local_dir=tmp_path, holder=saved) as ckpt:
        ckpt.save(5)
    restored = Holder(seed=2)
    with Checkpointer(local_dir=tmp_path, holder=restored) as ckpt:
        assert ckpt.restore() == 5
    assert _equal(restored.state, saved.state)
    for tensor in _flat(restored.state):
        if isinstance(tensor, torch.Tensor) and tensor.numel():
            assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()


def _resign(folder, name: str, data: bytes) -> None:
    """Rewrite a file of a committed checkpoint and its manifest entry, as a forger could (checksums are no
    signature): only the checks of the content itself stand between it and the model."""
    (folder / name).write_bytes(data)
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    for entry in manifest["files"]:
        if entry["name"] == name:
            entry["bytes"], entry["checksum"] = len(data), digest(data, manifest["checksum"])
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("move", ["overlap", "past_the_end", "no_such_part"])
def test_a_skeleton_placing_tensors_over_each_other_or_outside_their_file_is_skipped(setup, make_setup, tmp_path,
                                                                                       move):
    """A state.pkl whose tensors overlap, run past their data file or name a part that is not there: the
    checkpoint is skipped whole and the older one restored, nothing of the bad one loaded."""
    with setup.checkpointer(tmp_path) as ckpt:
        ckpt.save(1)
        ckpt.wait()
        at_one = setup.weights()
        setup.train(2)
        ckpt.save(2)
    folder = tmp_path / "step-00000002"
    skeleton = load_skeleton((folder / "state.pkl").read_bytes())
    weight = skeleton["objects"]["model"]["0.weight"]
    bias = skeleton["objects"]["model"]["0.bias"]
    size = (folder / "data-00000.bin").stat().st_size
    forged = {"overlap": TensorRef(bias.part, weight.offset + 4, bias.nbytes, bias.dtype, bias.shape, bias.device),
              "past_the_end": TensorRef(bias.part, size - 4, bias.nbytes, bias.dtype, bias.shape, bias.device),
              "no_such_part": TensorRef(7, 0, bias.nbytes, bias.dtype, bias.shape, bias.device)}[move]
    skeleton["objects"]["model"]["0.bias"] = forged
    _resign(folder, "state.pkl", pickle.dumps(skeleton))
    other = make_setup(seed=42)
    with other.checkpointer(tmp_path) as ckpt:
        assert ckpt.restore() == 1
    assert same(other.weights(), at_one)


def test_a_byte_changed_in_the_local_copy_is_found_by_the_read_and_repaired_from_the_durable_tier(
        setup, make_setup, tmp_path):
    """A local data file with its size intact but a byte changed (after the prefetch copied it, say): no check
    ahead of the read sees it; the read's checksum does, the durable copy replaces it, the step is restored."""
    url = "memory://ckpt-test-restore-once"
    with setup.checkpointer(tmp_path, durable_url=url) as ckpt:
        ckpt.save(3)
    saved = setup.weights()
    path = tmp_path / "step-00000003" / "data-00000.bin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    other = make_setup(seed=1)
    with other.checkpointer(tmp_path, durable_url=url) as ckpt:
        assert ckpt.restore() == 3
    assert same(saved, other.weights())
    assert path.read_bytes() != bytes(data)  # the local copy was repaired


def _two_steps(tmp_path):
    """Step 1 and step 2 of the same state's shapes with different values; the state saved at step 2."""
    for step, seed in ((1, 1), (2, 2)):
        holder = Holder(seed)
        with Checkpointer(local_dir=tmp_path, holder=holder, keep=5) as ckpt:
            ckpt.save(step)
    return holder.state


def test_memory_made_ready_from_another_checkpoint_gives_the_step_read_and_nothing_else(tmp_path):
    """The pool is filled from step 1's sizes (its tensors hold whatever); reading step 2 into it gives step
    2's bytes exactly, and takes the pool's tensors (no fresh memory where it had some of the size)."""
    at_two = _two_steps(tmp_path)
    local = LocalTier(tmp_path)
    shutil.move(str(local.folder(2)), str(tmp_path / "later"))  # the pool sees step 1 only
    pool = WarmPool().start(local)
    pool.join()
    shutil.move(str(tmp_path / "later"), str(local.folder(2)))
    ready = pool.bytes
    assert ready == sum(newest_tensor_sizes(LocalTier(tmp_path))) > 0
    state = read_folder(local.folder(2), local.read_manifest(local.folder(2)), pool)
    assert _equal(state["objects"]["holder"], at_two)
    assert pool.bytes == 0  # every tensor was read into memory made ready


def test_memory_made_ready_does_not_let_a_damaged_checkpoint_through(tmp_path):
    """With the pool full of tensors of the right sizes, a flipped byte is still caught by the read."""
    _two_steps(tmp_path)
    local = LocalTier(tmp_path)
    pool = WarmPool().start(local)
    pool.join()
    path = local.folder(2) / "data-00000.bin"
    data = bytearray(path.read_bytes())
    data[-200] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        read_folder(local.folder(2), local.read_manifest(local.folder(2)), pool)


def test_the_pool_takes_its_sizes_from_a_prefetched_folder(tmp_path):
    """A folder the prefetch is still filling (its state.pkl there, no manifest yet) gives the sizes; a
    damaged skeleton is passed over for an older one; no folder, no sizes."""
    _two_steps(tmp_path)
    local = LocalTier(tmp_path)
    (local.folder(2) / "manifest.json").unlink()  # prefetched, not committed here
    (local.folder(3)).mkdir()
    (local.folder(3) / "state.pkl").write_bytes(b"\x80\x05 not a pickle")
    sizes = newest_tensor_sizes(local)
    refs = load_skeleton((local.folder(2) / "state.pkl").read_bytes())
    assert sorted(sizes) == sorted(r.nbytes for r in _flat(refs) if isinstance(r, TensorRef) and r.nbytes)
    assert newest_tensor_sizes(LocalTier(tmp_path / "nothing-here")) == []
