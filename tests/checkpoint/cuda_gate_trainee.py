"""A job's script started ahead of its attempt on a GPU node (runner/checkpoint/cuda_gate.py).

``argv[1]``: how it first uses CUDA: ``python`` (``torch.cuda.init()``, torch's Python path), ``tensor`` (a tensor
created on the device: torch's C++ path), ``restore_first`` (a Checkpointer's ``restore()`` first, on the CPU, then
a tensor on the device), or ``before_import`` (CUDA initialised before runner.checkpoint is imported; on a CPU-only
torch, which cannot initialise CUDA, the state such a script leaves is set by hand).
``argv[2]`` (optional): megabytes to allocate on the device once CUDA is up. A line on stdin asks it to print
whether CUDA is initialised, whatever its main thread is doing.
"""

import os
import sys
import threading

import torch

first_use = sys.argv[1]
megabytes = int(sys.argv[2]) if len(sys.argv) > 2 else 0


def answer_questions() -> None:
    for _ in sys.stdin:
        print(f"cuda initialized: {torch.cuda.is_initialized()}", flush=True)


threading.Thread(target=answer_questions, daemon=True).start()
if first_use == "before_import":
    if torch.cuda.is_available():
        torch.cuda.init()
    else:
        torch.cuda._initialized = True
import runner.checkpoint  # noqa: F401 - where the gate is armed

print("runner.checkpoint imported", flush=True)
if first_use == "restore_first":
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        with runner.checkpoint.Checkpointer(local_dir=folder, model=torch.nn.Linear(2, 2), interval="1h") as ckpt:
            print(f"restored step {ckpt.restore()}", flush=True)
try:
    if first_use == "python":
        torch.cuda.init()
    else:
        torch.zeros(1, device="cuda")
    result = "ok"
    if megabytes:
        block = torch.empty(megabytes << 20, dtype=torch.uint8, device="cuda")
        result += f", {torch.cuda.memory_allocated() >> 20} MB allocated"
except Exception as exc:  # noqa: BLE001 - a CPU-only torch says it was not compiled with CUDA
    result = f"{type(exc).__name__}: {exc}"
print(f"past the first CUDA use ({result}); resume step {os.environ.get('RUNNER_RESUME_STEP')}, "
      f"waits {os.environ.get('RUNNER_RESUME_WAIT')}", flush=True)
