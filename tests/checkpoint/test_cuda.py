"""The CUDA paths of the library: pinned staging on a side stream, restore onto the device, CUDA RNG.

These run only where a GPU is present (`pytest tests/checkpoint/test_cuda.py` on a GPU machine); on a
CPU-only machine they are skipped, and the CPU tests cover the same code with host tensors.
"""

from __future__ import annotations

import pytest
import torch

from runner.checkpoint import Checkpointer
from runner.checkpoint.staging import Stager

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).cuda()


def test_gpu_tensors_are_staged_into_one_reused_pinned_buffer():
    """Staging GPU state copies it into pinned host memory, and the second save reuses the same buffer."""
    stager = Stager()
    state = {"w": torch.randn(1024, 1024, device="cuda")}
    stager.stage(state)
    first = stager._buffer
    assert first.is_pinned()
    stager.stage({"w": torch.randn(1024, 1024, device="cuda")})
    assert stager._buffer.data_ptr() == first.data_ptr()


def test_training_may_change_gpu_weights_as_soon_as_save_returns(tmp_path):
    """save() synchronises the copy: weights changed on the device right after it are not in the checkpoint."""
    model = _model()
    saved = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    with Checkpointer(local_dir=tmp_path, model=model, interval="1h") as ckpt:
        ckpt.save(1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)  # queued on the default stream right after save() returned
        assert ckpt.wait()
    other = _model()
    with Checkpointer(local_dir=tmp_path, model=other, interval="1h") as ckpt:
        assert ckpt.restore() == 1
    for name, tensor in other.state_dict().items():
        assert tensor.is_cuda and torch.equal(tensor.cpu(), saved[name])


def test_restore_puts_back_the_cuda_rng(tmp_path):
    """After a restore, the CUDA generator draws what it would have drawn at the save."""
    model = _model()
    with Checkpointer(local_dir=tmp_path, model=model, interval="1h") as ckpt:
        ckpt.save(1)
        ckpt.wait()
        expected = torch.rand(4, device="cuda").cpu()
        ckpt.restore()
        assert torch.equal(torch.rand(4, device="cuda").cpu(), expected)
