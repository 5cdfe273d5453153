"""Elastic gang benchmark, library level: a node vanishes without a reset, and the survivors are blocked in a
collective with it until something gets them out.

    python benchmarks/elastic_vanish.py [--trials 3] [--baseline /path/to/other/checkout] [--detect 0]

Three ranks of benchmarks/elastic.py's DDP job (one process per "node", gloo on CPU, its MLP and ballast). At a
step, rank 2 is frozen (SIGSTOP: its connections stay open and silent, as those of a machine that went away,
which sends no reset) and the survivors go on into the next step, whose all-reduce waits on it. ``--detect``
seconds later (the controller finding the node gone; 0: at once) the script, playing the agents, sends the
survivors the world without it, marked ``lost`` as the controller marks a world formed after a loss. The figure:
from the freeze to the survivors' first step done in the new world. ``RUNNER_ELASTIC_TIMEOUT_SECONDS`` is left at
its default (60 s), the bound on a collective with a silent peer.

``--baseline DIR`` runs the same trials, alternating, with the ranks importing the ``runner`` package of another
checkout (the code before a change), so both columns come from one run on one machine at one load.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import elastic as library_bench  # noqa: E402 - benchmarks/elastic.py: its rank program and harness


def trial(args, code: Path) -> float:
    """Seconds from the freeze to a step done by rank 0 in the world without the frozen rank."""
    # The ranks run that checkout's copy of benchmarks/elastic.py, which imports its own runner package.
    library_bench.ROOT, library_bench.__file__ = code, str(code / "benchmarks" / "elastic.py")
    s = 4
    with tempfile.TemporaryDirectory() as tmp:
        bench = library_bench.Bench(args, Path(tmp))
        bench.hold(s)
        port = library_bench.free_port()
        a, b, c = (library_bench.Node(bench, r, 3, port) for r in range(3))
        try:
            bench.held([a, b, c], s)
            c.proc.send_signal(signal.SIGSTOP)
            frozen = time.time()
            bench.hold(None)
            if args.detect:
                time.sleep(args.detect)
            port = library_bench.free_port()
            for node, node_rank in ((a, 0), (b, 1)):
                library_bench.until(lambda: node.server.trainees(), "a rank to connect")
                node.server.send({"op": "world", "generation": 1, "node_rank": node_rank, "nnodes": 2,
                                  "master_addr": "127.0.0.1", "master_port": port, "lost": True})
            library_bench.until(lambda: any(line["world"] == 2 for line in a.lines()), "a step in the new world",
                                timeout=600)
            return next(line["end"] for line in a.lines() if line["world"] == 2) - frozen
        finally:
            for node in bench.nodes:
                if node.proc.poll() is None:
                    node.proc.kill()
                node.server.close()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--baseline", help="another checkout whose runner package the baseline's ranks import")
    p.add_argument("--detect", type=float, default=0.0, help="seconds from the freeze to the world message")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--state-mb", type=int, default=100)
    args = p.parse_args()
    codes = [("after", HERE.parent)] + ([("before", Path(args.baseline).resolve())] if args.baseline else [])
    seconds: dict[str, list[float]] = {name: [] for name, _ in codes}
    loads = []
    for _ in range(args.trials):
        for name, code in codes:
            loads.append(os.getloadavg()[0])
            seconds[name].append(trial(args, code))
            print(f"{name}: {seconds[name][-1]:.2f} s (load {loads[-1]:.1f})", flush=True)
    print(f"machine: {os.cpu_count()} cores, load average {min(loads):.1f} to {max(loads):.1f}; "
          f"detection {args.detect:.1f} s; RUNNER_ELASTIC_TIMEOUT_SECONDS "
          f"{os.environ.get('RUNNER_ELASTIC_TIMEOUT_SECONDS', '60 (default)')}")
    print("| figure | " + " | ".join(name for name, _ in codes) + (" | after / before |" if args.baseline else " |"))
    print("| --- " * (len(codes) + 1 + bool(args.baseline)) + "|")
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    row = "| node frozen (no reset) to the survivors' first step in the new world, median | "
    row += " | ".join(f"{medians[name]:.2f} s" for name, _ in codes)
    row += f" | {medians['after'] / medians['before']:.3f} |" if args.baseline else " |"
    print(row)
    print("trials: " + "; ".join(f"{name} " + ", ".join(f"{v:.2f}" for v in values)
                                 for name, values in seconds.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
