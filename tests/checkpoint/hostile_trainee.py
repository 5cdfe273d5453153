"""A training loop that saves at every step and, with ``--ignore-stop``, goes on after ``should_stop``: an
attempt that the runner has already replaced but that keeps calling ``save()``.

Prints ``ready <step>`` after restoring, ``stopping <step>`` when ``should_stop`` first becomes true, ``saved
<step>`` after each ``save()`` + ``wait()`` has returned, and ``done`` after ``close()``. It runs until
``--until`` names a file that exists (or ``--max-steps``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from runner.checkpoint import Checkpointer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local-dir", required=True)
    parser.add_argument("--durable-url", required=True)
    parser.add_argument("--keep", type=int, default=2)
    parser.add_argument("--until", required=True)
    parser.add_argument("--max-steps", type=int, default=100_000)
    parser.add_argument("--step-time", type=float, default=0.02)
    parser.add_argument("--ignore-stop", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = Checkpointer(local_dir=args.local_dir, durable_url=args.durable_url, every_steps=10**9,
                        keep=args.keep, model=model, optimizer=optimizer)
    step = ckpt.restore()
    print(f"ready {step}", flush=True)
    announced = False
    until = Path(args.until)
    while step < args.max_steps and not until.exists():
        loss = model(torch.randn(3, 4)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        ckpt.step(step)
        if ckpt.should_stop and not announced:
            announced = True
            print(f"stopping {step}", flush=True)
            if not args.ignore_stop:
                break
        ckpt.save(step)
        ckpt.wait()
        print(f"saved {step}", flush=True)
        time.sleep(args.step_time)
    ckpt.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
