"""What a GPU gang node's process started ahead has behind it when it holds before its first CUDA use.

On a kept GPU node the next attempt's ranks hold at their first CUDA use (runner/checkpoint/cuda_gate.py); on a
CPU node they go on to wait in ``restore()`` with the model built. Each trial starts, in a fresh interpreter, a
typical training script (torch, torch.nn, torch.distributed, torch.utils.data and runner.checkpoint imported, a
~25M-parameter model, a Checkpointer) as a process started ahead, and times it from the spawn to its ``waiting``:
held before CUDA (the gate on: what a GPU node saves from the pause, the model not built), and in ``restore()``
(the gate off, the model built on the CPU: what a CPU node saves). For scale, the same for a bare interpreter and
``import torch`` run to their exit. Wall seconds and the process's CPU seconds (user + system, from /proc at the
moment it says ``waiting``), means of N interleaved trials, with each row's ratio to the gate's row.

    python benchmarks/gpu_start_ahead.py --repeat 3
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agents.control import ControlServer

SCRIPT = '''
import torch, torch.nn as nn, torch.distributed, torch.utils.data
from runner.checkpoint import Checkpointer
device = "cuda" if __import__("os").environ.get("RUNNER_CUDA_GATE") else "cpu"
model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(6)]).to(device)  # the gate holds here on a GPU node
ckpt = Checkpointer(local_dir=__import__("sys").argv[1], model=model, interval="1h")
ckpt.restore()  # a CPU node's process started ahead waits here
'''


def exit_run(code: str) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def to_waiting(gate: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="gsa") as folder:
        said = []
        control = ControlServer(Path(folder) / "c.sock", said.append).start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
        env.update({"RUNNER_CONTROL": str(control.path), "RUNNER_RESUME_WAIT": "1",
                    "PYTHONPATH": str(REPO), **({"RUNNER_CUDA_GATE": "1"} if gate else {})})
        started = time.monotonic()
        process = subprocess.Popen([sys.executable, "-c", SCRIPT, folder], env=env, cwd=REPO,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while not any(m.get("op") == "waiting" for m in said):
                if process.poll() is not None:
                    raise SystemExit(f"the script exited ({process.returncode}) before it said waiting")
                time.sleep(0.01)
            wall = time.monotonic() - started
            fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        finally:
            process.kill()
            process.wait()
            control.close()
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = {"bare interpreter (to its exit)": lambda: exit_run("pass"),
            "import torch (to its exit)": lambda: exit_run("import torch"),
            "started ahead, held before CUDA (GPU node)": lambda: to_waiting(gate=True),
            "started ahead, waiting in restore() (CPU node)": lambda: to_waiting(gate=False)}
    totals = {name: [0.0, 0.0] for name in rows}
    for _ in range(args.repeat):
        for name, measure in rows.items():
            wall, cpu = measure()
            totals[name][0] += wall / args.repeat
            totals[name][1] += cpu / args.repeat
    base = totals["started ahead, held before CUDA (GPU node)"]
    print(f"load average at the end: {os.getloadavg()[0]:.1f}; {args.repeat} trials")
    print(f"{'':50s} {'wall s':>7s} {'x gate':>7s} {'CPU s':>7s} {'x gate':>7s}")
    for name, (wall, cpu) in totals.items():
        print(f"{name:50s} {wall:7.2f} {wall / base[0]:7.2f} {cpu:7.2f} {cpu / base[1]:7.2f}")


if __name__ == "__main__":
    main()
