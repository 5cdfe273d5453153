"""On a real GPU: a process started ahead with the CUDA gate creates no CUDA context while another process (the
running attempt's rank) holds the GPU's memory, and after the agent's word it initialises CUDA and allocates
(runner/checkpoint/cuda_gate.py). Skipped without CUDA; about 20 s on a GPU machine:

    python -m pytest -q tests/checkpoint/test_cuda_gate_gpu.py -n 0
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

from tests.checkpoint.test_cuda_gate import Job

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

HOLDER = ("import sys, torch; block = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); "
          "print('holding', torch.cuda.memory_allocated() >> 20, 'MB', flush=True); sys.stdin.read()")


def compute_pids() -> set[int] | None:
    """The PIDs nvidia-smi lists with a CUDA context; None where there is no nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], check=False,
                         capture_output=True, text=True, timeout=30).stdout
    return {int(line) for line in out.split() if line.strip().isdigit()}


def test_the_held_process_has_no_cuda_context_beside_a_busy_gpu_and_allocates_after_the_word():
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    job = None
    try:
        assert holder.stdout.readline().startswith("holding 1024 MB"), "the running attempt's rank did not allocate"
        job = Job("tensor", megabytes=256)
        assert job.waiting()["at"] == "before_cuda"
        assert job.ask_cuda_initialized() == "cuda initialized: False"  # from inside the held process
        pids = compute_pids()
        if pids is not None and holder.pid in pids:  # (a container may show other PIDs: then this part says nothing)
            assert job.process.pid not in pids, "the held process has a CUDA context"

        job.control.send({"op": "resume", "step": 7, "attempt": 3})
        job.wait_for(lambda: "past the first CUDA use" in job.output(), "the first CUDA use to go on")
        assert job.process.wait(60) == 0
        assert "past the first CUDA use (ok, 256 MB allocated); resume step 7" in job.output(), job.output()
    finally:
        if job is not None:
            job.close()
        holder.kill()
        holder.wait(30)


def test_cuda_initialised_before_the_import_is_said_on_a_gpu_too():
    job = Job("before_import")
    try:
        assert job.waiting()["at"] == "after_cuda"
        assert job.ask_cuda_initialized() == "cuda initialized: True"
    finally:
        job.close()
