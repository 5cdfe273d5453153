"""What passing ``loss=`` to ``ckpt.step()`` costs per step (no save due), against the same loop without it.

    python benchmarks/step_telemetry.py [--steps 20000] [--repeat 3]

Rows: nothing per step (the loop's floor), ``ckpt.step(s)``, ``ckpt.step(s, loss=x)`` with a Python float,
and with a scalar tensor on the CPU (and on CUDA when a GPU is present; there, with CUDA's sync debug mode
set to raise, so a device sync in the step would fail the run). Each figure is the best of ``--repeat``
runs, in microseconds per step. A report to the agent is due every 5 s; without an agent it sends nothing,
but its work (counter poll, peak memory) runs all the same.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import machine  # noqa: E402

from runner.checkpoint import Checkpointer  # noqa: E402


def per_step_us(steps: int, repeat: int, loss, device: str | None) -> float:
    """Best of ``repeat`` loops of ``steps`` calls, in microseconds per step; ``loss`` "none" skips ckpt.step."""
    best = float("inf")
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as folder, \
                Checkpointer(local_dir=folder, interval="1h", extra={"x": 0}) as ckpt:
            values = [torch.tensor(1.0 / (s + 1), device=device) for s in range(64)] if device else None
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
            started = time.perf_counter()
            for step in range(1, steps + 1):
                if loss == "none":
                    continue
                if loss == "float":
                    ckpt.step(step, loss=1.0 / step)
                elif loss == "tensor":
                    ckpt.step(step, loss=values[step % 64])
                else:
                    ckpt.step(step)
            elapsed = time.perf_counter() - started
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("default")
        best = min(best, elapsed / steps * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = [("nothing", "none", None), ("`ckpt.step(s)`", "no-loss", None),
            ("`ckpt.step(s, loss=float)`", "float", None), ("`ckpt.step(s, loss=cpu tensor)`", "tensor", "cpu")]
    if torch.cuda.is_available():
        rows.append(("`ckpt.step(s, loss=cuda tensor)`, sync debug mode: error", "tensor", "cuda"))
    print(machine())
    print(f"\n{args.steps} steps, best of {args.repeat}\n")
    print("| each step calls | us/step |\n| --- | ---: |")
    for label, loss, device in rows:
        print(f"| {label} | {per_step_us(args.steps, args.repeat, loss, device):.2f} |")


if __name__ == "__main__":
    main()
