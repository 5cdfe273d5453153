"""A stand-in for the training side of an elastic gang, speaking the control channel by hand (no torch): it
trains a step every 50 ms, prints its pid, step and world, moves to each ``world`` it is handed at its next step
(node rank 0 of the new world reports ``world_changed``), and exits 0 once the file named on its command line
exists. A process started with RUNNER_ELASTIC_JOIN=1 waits for its world first."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

finish = Path(sys.argv[1])
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.connect(os.environ["RUNNER_CONTROL"])
lock, worlds = threading.Lock(), []


def send(message: dict) -> None:
    conn.sendall((json.dumps(message) + "\n").encode())


def read() -> None:
    buffer = b""
    while True:
        data = conn.recv(65536)
        if not data:
            return
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            message = json.loads(line)
            if message.get("op") == "world":
                with lock:
                    worlds.append(message)


node_rank, size = int(os.environ["RUNNER_NODE_RANK"]), int(os.environ["RUNNER_NUM_NODES"])
send({"op": "hello", "pid": os.getpid(), "job_id": os.environ["RUNNER_JOB_ID"],
      "attempt": int(os.environ["RUNNER_ATTEMPT"]), "rank": node_rank, "local_rank": 0, "world_size": size})
threading.Thread(target=read, daemon=True).start()
generation, step = 0, 0
joining = os.environ.get("RUNNER_ELASTIC_JOIN") == "1"
print(f"pid {os.getpid()} start joining={int(joining)} min_nodes={os.environ.get('RUNNER_MIN_NODES')}", flush=True)
if not joining:
    send({"op": "restored", "step": 0, "manifest": None})
while not finish.exists():
    with lock:
        newest = max(worlds, key=lambda w: w["generation"]) if worlds else None
    if newest is not None and newest["generation"] > generation:
        generation, node_rank, size = newest["generation"], newest["node_rank"], newest["nnodes"]
        if joining and step == 0:
            send({"op": "restored", "step": 0, "manifest": None, "from_peer": True})
        if node_rank == 0:
            send({"op": "world_changed", "generation": generation, "step": step, "world_size": size})
        print(f"pid {os.getpid()} step {step} moved to generation {generation} as node {node_rank} of {size}",
              flush=True)
    if joining and generation == 0:
        time.sleep(0.05)
        continue
    step += 1
    if step % 20 == 0:
        print(f"pid {os.getpid()} step {step} world {size} generation {generation}", flush=True)
    time.sleep(0.05)
send({"op": "closed", "step": None, "error": False})
conn.close()
print(f"pid {os.getpid()} done at step {step}", flush=True)
