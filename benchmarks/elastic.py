"""Elastic gang benchmark, library level: a 3-rank DDP job loses a rank by notice, trains on 2, a replacement
joins (receiving the state from a peer), then a rank vanishes (SIGKILL) and the survivors go on.

    python benchmarks/elastic.py [--state-mb 100] [--steps 30] [--width 1024]

Each rank is its own process (one per "node", gloo on CPU, OMP_NUM_THREADS=1); the script plays the nodes'
agents with the agent's control server and sends the ``world`` messages a controller would. Every rank
registers the DDP model, its SGD momentum and a ``--state-mb`` ballast tensor with the Checkpointer, so
the state a joining rank receives weighs about ``--state-mb`` MB. Figures (wall clock of one machine):

* steps/s of rank 0 at full width (3 ranks), with 2 survivors while the node is missing, and again at full
  width after the join; the goal for the survivors is at least 0.9 x 2/3 of full width per job, i.e. a
  rank's own steps/s at least 0.9 of full width's (each rank does the same work per step);
* shrink by notice: from the agreed step's ``ckpt.step()`` to training again (the pause of the change);
* loss without notice: from the SIGKILL to the survivors' first step done in the new world (the world
  message is sent at once here; a controller's detection comes on top);
* grow: from the moment the replacement is ready (its process connected and waiting in ``restore()``)
  and the world is sent, to the first step done at full width; against 5 s + the state's size at 100 MB/s;
* where each change's seconds go, phase by phase (the Checkpointer's record of its last change, read here
  from a private attribute, and the user's DDP rebuild): waiting for saves in flight and for the world
  message, the new default group, the side groups, the census, swapping the groups in (the old ones'
  destructors), moving the state, DDP.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rank_program(args) -> int:
    import torch
    import torch.distributed as dist
    from torch import nn

    from runner.checkpoint import Checkpointer

    class Ballast:
        def __init__(self, megabytes: int) -> None:
            self.tensor = torch.zeros(megabytes * 2**20 // 4)

        def state_dict(self):
            return {"tensor": self.tensor}

        def load_state_dict(self, state):
            self.tensor.copy_(state["tensor"])

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, args.width))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    ckpt = Checkpointer(model=model, optimizer=optimizer, ballast=Ballast(args.state_mb), local_dir=args.local_dir,
                        interval="1h")
    step = ckpt.restore()
    joined = time.time()
    ddp = nn.parallel.DistributedDataParallel(model)
    x = torch.randn(32, args.width)
    out = open(args.report, "a")
    phases = ckpt._mode.elastic.last_phases  # a joiner's restore(): how its change's seconds went (not a public API)
    if phases is not None:
        out.write(json.dumps({"join": phases.seconds, "ddp": time.time() - joined}) + "\n")
    while step < args.steps:
        started = time.time()
        loss = ddp(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        stepped = time.time()
        ckpt.step(step)
        if ckpt.should_stop:
            break
        changed = time.time()
        if ckpt.world_changed:
            ddp = nn.parallel.DistributedDataParallel(model)
        line = {"step": step, "world": ckpt.world_size, "rank": ckpt.rank, "start": started, "stepped": stepped,
                "end": time.time(), "changed": ckpt.world_changed}
        if ckpt.world_changed:
            line["phases"] = {**ckpt._mode.elastic.last_phases.seconds, "ddp": round(line["end"] - changed, 4)}
        out.write(json.dumps(line) + "\n")
        out.flush()
        while Path(args.gate).read_text().strip() and step >= int(Path(args.gate).read_text()):
            Path(f"{args.gate}.{os.getpid()}").write_text(str(step))
            time.sleep(0.01)
    ckpt.close()
    dist.destroy_process_group()
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    def __init__(self, bench: "Bench", rank: int, world: int, port: int, join: bool = False) -> None:
        from agents.control import ControlServer

        self.messages: queue.Queue = queue.Queue()
        self.server = ControlServer(bench.tmp / f"c{len(bench.nodes)}.sock", self.messages.put).start()
        self.report = bench.tmp / f"r{len(bench.nodes)}.jsonl"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "RANK": str(rank),
               "WORLD_SIZE": str(world), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "RUNNER_CONTROL": str(self.server.path), "RUNNER_NUM_NODES": "3",
               "RUNNER_MIN_NODES": "1", "PYTHONPATH": str(ROOT), **({"RUNNER_ELASTIC_JOIN": "1"} if join else {})}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--rank-program", "--steps", str(bench.args.steps), "--width",
             str(bench.args.width), "--state-mb", str(bench.args.state_mb), "--local-dir",
             str(bench.tmp / f"l{len(bench.nodes)}"), "--report", str(self.report), "--gate", str(bench.gate)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        bench.nodes.append(self)

    def world(self, generation: int, node_rank: int, nnodes: int, port: int) -> None:
        until(lambda: self.server.trainees(), "a rank to connect")
        self.server.send({"op": "world", "generation": generation, "node_rank": node_rank, "nnodes": nnodes,
                          "master_addr": "127.0.0.1", "master_port": port})

    def lines(self) -> list[dict]:
        """The report's step lines."""
        return [line for line in self.records() if "step" in line]

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.report.read_text().splitlines()] if self.report.is_file() else []


def until(condition, what: str, timeout: float = 600.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.01)
    raise SystemExit(f"timed out waiting for {what}")


class Bench:
    def __init__(self, args, tmp: Path) -> None:
        self.args, self.tmp, self.nodes = args, tmp, []
        self.gate = tmp / "gate"

    def hold(self, step: int | None) -> None:
        self.gate.write_text("" if step is None else str(step))

    def held(self, nodes, step: int) -> None:
        until(lambda: all(Path(f"{self.gate}.{n.proc.pid}").is_file()
                          and Path(f"{self.gate}.{n.proc.pid}").read_text() == str(step) for n in nodes),
              f"ranks at step {step}")


def rate(lines: list[dict], world: int) -> float:
    """Steps per second over the steps at ``world``, skipping the first two after a change (warm-up)."""
    runs = [line for line in lines if line["world"] == world]
    stretch = [line for line in runs if not line["changed"]][2:]
    return len(stretch) / sum(line["end"] - line["start"] for line in stretch) if stretch else float("nan")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rank-program", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--state-mb", type=int, default=100)
    p.add_argument("--local-dir")
    p.add_argument("--report")
    p.add_argument("--gate")
    args = p.parse_args()
    if args.rank_program:
        return rank_program(args)
    s = args.steps // 6  # full width until s, 2 ranks to 3s, full width to 5s, then a kill
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(args, Path(tmp))
        bench.hold(s)
        port = free_port()
        a, b, c = (Node(bench, r, 3, port) for r in range(3))
        try:
            bench.held([a, b, c], s)
            port = free_port()
            a.world(1, 0, 2, port)
            b.world(1, 1, 2, port)
            bench.hold(3 * s)
            until(lambda: any(m.get("op") == "world_changed" for m in list(a.messages.queue)), "the shrink")
            c.server.send({"op": "checkpoint", "reason": "notice", "stop": True, "deadline": time.time() + 60})
            bench.held([a, b], 3 * s)
            joiner = Node(bench, 0, 1, free_port(), join=True)
            until(lambda: joiner.server.trainees(), "the joiner to connect")
            ready = time.time()
            port = free_port()
            for node, node_rank in ((a, 0), (b, 1), (joiner, 2)):
                node.world(2, node_rank, 3, port)
            bench.hold(5 * s)
            bench.held([a, b, joiner], 5 * s)
            joined = min(line["end"] for line in joiner.lines())
            join_phases = next(r for r in joiner.records() if "join" in r)
            joiner.proc.send_signal(signal.SIGKILL)
            killed = time.time()
            port = free_port()
            a.world(3, 0, 2, port)
            b.world(3, 1, 2, port)
            bench.hold(None)
            for node in (a, b):
                node.proc.wait(600)
        finally:
            for node in bench.nodes:
                if node.proc.poll() is None:
                    node.proc.kill()
                node.server.close()
        lines = a.lines()
        changes = [line for line in lines if line["changed"]]
        shrink_pause = changes[0]["end"] - changes[0]["stepped"]
        after_kill = changes[2]["end"] - killed
        full, narrow = rate([line for line in lines if line["step"] <= 3 * s], 3), rate(lines, 2)
        full_again = rate([line for line in lines if 3 * s < line["step"] <= 5 * s], 3)
        state_mb = args.state_mb + 2 * 2 * args.width * args.width * 4 / 2**20
        goal_grow = 5 + state_mb / 100
        load = os.getloadavg()[0]
        print(f"machine: {os.cpu_count()} cores, load average {load_before:.1f} before, {load:.1f} after; "
              f"3 ranks of {args.width}-wide MLP, "
              f"state ~{state_mb:.0f} MB")
        print("| figure | value | baseline | ratio |")
        print("| --- | --- | --- | --- |")
        print(f"| rank 0 steps/s, full width (3) | {full:.1f} | - | 1.00 |")
        print(f"| rank 0 steps/s, survivors (2) | {narrow:.1f} | {full:.1f} (full width) | {narrow / full:.2f} "
              f"(goal >= 0.90) |")
        print(f"| rank 0 steps/s, full width after the join | {full_again:.1f} | {full:.1f} | {full_again / full:.2f} |")
        print(f"| shrink by notice: agreed step's ckpt.step() to training again | {shrink_pause:.2f} s | 5 s (goal) "
              f"| {shrink_pause / 5:.2f} |")
        print(f"| loss (SIGKILL, world sent at once) to a step done | {after_kill:.2f} s | 10 s (goal) | "
              f"{after_kill / 10:.2f} |")
        print(f"| grow: replacement ready to a step done at full width | {joined - ready:.2f} s | {goal_grow:.1f} s "
              f"(goal: 5 s + {state_mb:.0f} MB at 100 MB/s) | {(joined - ready) / goal_grow:.2f} |")
        print("\nwhere a change's seconds go (rank 0; the joiner's restore() for the grow):")
        names = ("saves", "world_wait", "group", "side_groups", "census", "swap_groups", "state", "ddp")
        print("| change | " + " | ".join(names) + " |")
        print("| --- " * (len(names) + 1) + "|")
        for what, phases in (("shrink (notice)", changes[0]["phases"]), ("grow, rank 0", changes[1]["phases"]),
                             ("grow, joiner", {**join_phases["join"], "ddp": join_phases["ddp"]}),
                             ("loss", changes[2]["phases"])):
            print(f"| {what} | " + " | ".join(f"{phases[n]:.2f}" if n in phases else "-" for n in names) + " |")
        print(f"median step at full width {statistics.median(l['end'] - l['start'] for l in lines[:s]) * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
