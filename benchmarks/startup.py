"""The CPU that the processes the runner starts often spend importing, each in a fresh interpreter.

Every simulated node, agent, CLI command, controller and training process starts a new interpreter; on a small
machine running many of them (the test suite on two cores, a node starting a gang) their start is much of the
work. Printed per entry point: the mean CPU (user + system) of N starts, and its ratio to a bare interpreter's
in the same run (the floor).

    python benchmarks/startup.py --repeat 10
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENTRY_POINTS = {
    "bare interpreter": "pass",
    "simulated node (its metadata servers)": "import runner.providers.local.node, runner.providers.local.metadata",
    "runner status / logs / restarts": "from runner.cli.main import cli; cli.get_command(None, 'status')",
    "runner submit": "from runner.cli.main import cli; cli.get_command(None, 'submit'); import runner.spec.load",
    "runner agent": "from runner.cli.main import cli; cli.get_command(None, 'agent'); import agents.main",
    "runner server": "import runner.cli.server, runner.controller.daemon",
    "torch alone": "import torch",
    "torch + runner.checkpoint": "import torch, runner.checkpoint",
    "torch + its compiler stack (an optimizer's first step)": "import torch, torch._dynamo",
}


def cpu_seconds(code: str, repeat: int) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(repeat):
        subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    floor = cpu_seconds(ENTRY_POINTS["bare interpreter"], args.repeat)
    print(f"{'entry point':58s} {'CPU ms':>8s} {'x floor':>8s}")
    for name, code in ENTRY_POINTS.items():
        seconds = floor if name == "bare interpreter" else cpu_seconds(code, args.repeat)
        print(f"{name:58s} {seconds * 1000:8.0f} {seconds / floor:8.1f}")


if __name__ == "__main__":
    main()
