"""The elastic gang's CUDA path: its default group over NCCL, left and made again as at a shrink or grow.

On a CPU-only machine these are skipped (the elastic e2e tests cover the same code over gloo). On a GPU machine
they run one process on one device: a world of one is all one GPU allows NCCL, and it is enough to show that DDP
trains over the wrapped NCCL group, that leaving it aborts NCCL without hanging, and that a new group made after
it trains again.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SCRIPT = textwrap.dedent("""
    import sys, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from runner.checkpoint import tolerant_group

    def train_step(model):
        ddp = DistributedDataParallel(model, device_ids=[0])
        x = torch.ones(8, 16, device="cuda")
        ddp(x).sum().backward()
        torch.cuda.synchronize()
        return [p.grad.clone() for p in model.parameters()]

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4).cuda()
    reference = torch.nn.Linear(16, 4).cuda()
    reference.load_state_dict(model.state_dict())
    reference(torch.ones(8, 16, device="cuda")).sum().backward()

    group = tolerant_group.init_default(dist.HashStore(), 0, 1)
    print("backend", type(group.inner).__name__, flush=True)
    grads = train_step(model)
    assert all(torch.equal(g, r.grad) for g, r in zip(grads, reference.parameters())), "DDP over NCCL changed grads"
    assert not group.broken, group.error

    start = time.monotonic()
    tolerant_group.abandon()
    print("abandon seconds", round(time.monotonic() - start, 3), flush=True)
    assert not dist.is_initialized()

    model.zero_grad()
    tolerant_group.init_default(dist.HashStore(), 0, 1)
    grads = train_step(model)
    assert all(torch.equal(g, r.grad) for g, r in zip(grads, reference.parameters())), "second group changed grads"
    tolerant_group.abandon()
    print("ok", flush=True)
""")


def test_ddp_trains_over_the_elastic_nccl_group_and_a_new_group_after_leaving_it():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "backend ProcessGroupNCCL" in done.stdout, done.stdout
    assert done.stdout.rstrip().endswith("ok"), done.stdout
