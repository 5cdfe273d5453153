"""What a preemption costs on a market as slow as a cloud: trained through the notice against stopping at once.

A real controller (benchmarks/recovery_bench.py's Bench) runs the local market with a cloud's latencies
(``clouds.local.boot_seconds``: a launched node's agent starts that long after the launch;
``clouds.local.durable_mb_per_s``: the durable tier's bandwidth per node and direction), a job whose
``setup`` takes as long as a cloud node's and whose state is as large as the profile's checkpoint. Each
trial waits until the job trains, sends ``runner preempt JOB --notice aws|gcp`` through the node's metadata
server, and waits until the next attempt has trained a few steps. Two paths, interleaved, in one run:

- **trained through** (``recovery.prepare_on: [notice]``, the default): the replacement is launched at the
  notice; the old node trains on until the replacement is ready or the deadline nears, then takes its
  emergency checkpoint and the replacement resumes from it;
- **stop at once** (``recovery.prepare_on: []``, the behaviour before): the old node checkpoints and stops at
  the notice; the replacement is launched once the checkpoint is durable.

Figures per trial: the training **gap** (the old attempt's last step to the next attempt's first, both from
the job's own timestamped output), the steps redone (the old attempt's last step minus the step the next
resumed from), the steps the old node trained after the notice, and the restart log's own ledger (its
``gap_seconds``, ``boot_seconds``, ``setup_seconds``, ``restore_seconds``) and the job's ``goodput`` ratio.

Profiles (``--scale`` multiplies every duration and the checkpoint's size, keeping the bandwidth, so every
phase keeps its share):

| profile | notice | boot | setup | checkpoint | durable tier |
| --- | ---: | ---: | ---: | ---: | ---: |
| aws | 120 s | 60 s | 45 s | 1 GB | 200 MB/s |
| gcp | 30 s | 60 s | 45 s | 1 GB | 200 MB/s |

A third measure, ``--goodput N``: one job on the AWS profile (trained through) preempted every 10 minutes
(``--scale`` times that), N times; its goodput in steady state is the ledger's training seconds over its paid
node-seconds between the first notice and the end of the last cycle (the job's first boot and setup, paid once
per job, are left out), beside the job's whole-life ratio.

A fourth, ``--gang N``: the AWS profile's two paths again for an N-node ``torchrun`` gang (one process per node,
DDP on gloo), node 1 noticed. Its gap is split into phases read off the job's own output: each node's launcher and
each rank print when they started, imported torch, formed the process group, built the model and restored (the
trainee below), so every milestone of the next attempt is given in seconds after the old attempt's last step (a
negative figure: done ahead, while the old attempt still trained).

    python benchmarks/cloud_recovery.py [--profiles aws,gcp] [--count 1] [--scale 1] [--goodput 0] [--gang 0]
                                        [--root DIR] [--keep]
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.recovery_bench import Bench, wait_until  # noqa: E402
from benchmarks.report import machine  # noqa: E402

PROFILES = {
    "aws": {"notice": "aws", "notice_s": 120, "boot_s": 60, "setup_s": 45, "checkpoint_mb": 1000, "mb_per_s": 200},
    "gcp": {"notice": "gcp", "notice_s": 30, "boot_s": 60, "setup_s": 45, "checkpoint_mb": 1000, "mb_per_s": 200},
}
PATHS = {"trained through": "[notice]", "stop at once": "[]"}

# The job: a small model plus buffers that make its checkpoint the profile's size; every step is printed
# with its wall-clock time, so the gap is read off the job's own clock.
TRAINEE = """
import os, time
import torch
from runner.checkpoint import Checkpointer

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
state_mb = float(os.environ["BENCH_STATE_MB"])
# As a model's state is many tensors: eight of an eighth each (a tensor is one file of the checkpoint, and
# the replacement's download follows the upload file by file).
for i in range(8):
    model.register_buffer(f"ballast{i}", torch.rand(max(1, int(state_mb * 1e6 / 4 / 8))))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = Checkpointer(model=model, optimizer=optimizer)
step = ckpt.restore()
print(f"resumed from step {step}" if step else "starting fresh", flush=True)
while True:
    optimizer.zero_grad()
    model(torch.randn(16, 8)).pow(2).mean().backward()
    optimizer.step()
    step += 1
    print(f"step {step} at {time.time():.3f}", flush=True)
    ckpt.step(step)
    if ckpt.should_stop:
        break
    time.sleep(0.1)
ckpt.close()
"""
STEP = re.compile(r"^step (\d+) at ([0-9.]+)$", re.M)

# The gang's trainee: every rank holds the profile's state (replicated, as a DDP model's is) and prints when it
# started, imported torch, formed the process group, built the model and restored; rank 0 prints the steps.
GANG_TRAINEE = """
import time
STARTED = time.time()
import os
import torch
import torch.distributed as dist
from runner.checkpoint import Checkpointer
IMPORTED = time.time()
dist.init_process_group("gloo")
rank = dist.get_rank()
GROUP = time.time()
torch.manual_seed(0)
inner = torch.nn.Linear(8, 1)
state_mb = float(os.environ["BENCH_STATE_MB"])
for i in range(8):
    inner.register_buffer(f"ballast{i}", torch.rand(max(1, int(state_mb * 1e6 / 4 / 8))))
model = torch.nn.parallel.DistributedDataParallel(inner, broadcast_buffers=False)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = Checkpointer(model=model, optimizer=optimizer)
BUILT = time.time()
step = ckpt.restore()
RESTORED = time.time()
print(f"rank {rank} started {STARTED:.3f} imported {IMPORTED:.3f} group {GROUP:.3f} built {BUILT:.3f} "
      f"restored {RESTORED:.3f} from {step}", flush=True)
while True:
    optimizer.zero_grad()
    model(torch.randn(16, 8)).pow(2).mean().backward()
    optimizer.step()
    step += 1
    if rank == 0:
        print(f"step {step} at {time.time():.3f}", flush=True)
    ckpt.step(step)
    if ckpt.should_stop:
        break
    time.sleep(0.1)
ckpt.close()
"""
GANG_RUN = ('echo "launcher at $(date +%s.%N)"; exec torchrun --nnodes=$RUNNER_NUM_NODES '
            "--node-rank=$RUNNER_NODE_RANK --nproc-per-node=1 --master-addr=$RUNNER_MASTER_ADDR "
            "--master-port=$RUNNER_MASTER_PORT train.py")
LAUNCHER = re.compile(r"^launcher at ([0-9.]+)$", re.M)
RANK_TIMES = re.compile(r"^rank (\d+) started ([0-9.]+) imported ([0-9.]+) group ([0-9.]+) built ([0-9.]+) "
                        r"restored ([0-9.]+) from (\d+)$", re.M)
# The next attempt's milestones, each the latest over its nodes or ranks, in seconds after the old last step.
GANG_PHASES = ("launchers started", "workers started", "torch imported", "group formed", "model built",
               "restored", "first step")


def scaled(profile: dict, scale: float) -> dict:
    return {**profile, **{key: profile[key] * scale for key in ("notice_s", "boot_s", "setup_s", "checkpoint_mb")}}


def trial(bench: Bench, root: Path, name: str, prepare_on: str, profile: dict) -> dict:
    folder = root / name
    folder.mkdir()
    (folder / "train.py").write_text(TRAINEE)
    (folder / "job.yaml").write_text(yaml.safe_dump({
        "name": name, "setup": f"sleep {profile['setup_s']:.2f}", "run": "python train.py",
        "env": {"BENCH_STATE_MB": str(profile["checkpoint_mb"])},
        "resources": {"cloud": ["local"]},
        "checkpoint": {"interval": "60s", "keep": 2},
        "recovery": {"resume_drill": "off", "prepare_on": yaml.safe_load(prepare_on)},
    }))
    job_id = bench.cli_json("submit", str(folder / "job.yaml"))["id"]
    wait_until(lambda: re.search(r"^step 20 at", bench.cli("logs", job_id).stdout, re.M), 1800, "step 20",
               poll=0.5)
    sent = time.time()
    bench.cli("preempt", job_id, "--notice", profile["notice"])
    wait_until(lambda: len(STEP.findall(bench.cli("logs", job_id, "--attempt", "2", check=False).stdout)) >= 5,
               1800, "the next attempt's steps", poll=0.5)
    # The ledger's figures arrive with the next attempt's first telemetry report (batched every few seconds).
    def ledger_row():
        rows = bench.cli_json("restarts", job_id)
        return rows if len(rows) > 1 and rows[1].get("gap_seconds") is not None else None

    rows = wait_until(ledger_row, 300, "the ledger's gap", poll=0.5)
    status = bench.cli_json("status", job_id)
    bench.cli("cancel", job_id)
    old = [(int(s), float(t)) for s, t in STEP.findall(bench.cli("logs", job_id, "--attempt", "1").stdout)]
    new = [(int(s), float(t)) for s, t in STEP.findall(bench.cli("logs", job_id, "--attempt", "2").stdout)]
    second = rows[1]
    return {
        "gap": new[0][1] - old[-1][1],
        "redone": old[-1][0] - second["resumed_from_step"],
        "after_notice": sum(1 for _, t in old if t > sent),
        "ledger_gap": second.get("gap_seconds"),
        "boot": second.get("boot_seconds"), "setup": second.get("setup_seconds"),
        "restore": second.get("restore_seconds"),
        "goodput": (status.get("goodput") or {}).get("ratio"),
    }


def gang_trial(bench: Bench, root: Path, name: str, prepare_on: str, profile: dict, nodes: int) -> dict:
    """One gang job, node 1 noticed; the gap and the next attempt's milestones (GANG_PHASES)."""
    folder = root / name
    folder.mkdir()
    (folder / "train.py").write_text(GANG_TRAINEE)
    (folder / "job.yaml").write_text(yaml.safe_dump({
        "name": name, "setup": f"sleep {profile['setup_s']:.2f}", "run": GANG_RUN,
        "env": {"BENCH_STATE_MB": str(profile["checkpoint_mb"])},
        "resources": {"cloud": ["local"], "num_nodes": nodes},
        "checkpoint": {"interval": "60s", "keep": 2},
        "recovery": {"resume_drill": "off", "prepare_on": yaml.safe_load(prepare_on)},
    }))
    job_id = bench.cli_json("submit", str(folder / "job.yaml"))["id"]
    wait_until(lambda: re.search(r"^step 20 at", bench.cli("logs", job_id, "--node", "0").stdout, re.M), 1800,
               "step 20", poll=0.5)
    sent = time.time()
    bench.cli("preempt", job_id, "--node", "1", "--notice", profile["notice"])
    wait_until(lambda: len(STEP.findall(bench.cli("logs", job_id, "--attempt", "2", "--node", "0",
                                                  check=False).stdout)) >= 5,
               1800, "the next attempt's steps", poll=0.5)

    def ledger_row():
        rows = bench.cli_json("restarts", job_id)
        return rows if len(rows) > 1 and rows[1].get("gap_seconds") is not None else None

    rows = wait_until(ledger_row, 300, "the ledger's gap", poll=0.5)
    bench.cli("cancel", job_id)
    old_output = bench.cli("logs", job_id, "--attempt", "1", "--node", "0").stdout
    outputs = [bench.cli("logs", job_id, "--attempt", "2", "--node", str(rank)).stdout for rank in range(nodes)]
    old = [(int(s), float(t)) for s, t in STEP.findall(old_output)]
    new = [(int(s), float(t)) for s, t in STEP.findall(outputs[0])]
    last = old[-1][1]
    launchers = [float(t) for out in outputs for t in LAUNCHER.findall(out)]
    ranks = [tuple(float(x) for x in m[1:6]) for out in outputs for m in RANK_TIMES.findall(out)]
    milestones = [max(launchers, default=None)] + [max((r[i] for r in ranks), default=None) for i in range(5)]
    milestones.append(new[0][1])
    second = rows[1]
    return {
        "gap": new[0][1] - last,
        "redone": old[-1][0] - second["resumed_from_step"],
        "after_notice": sum(1 for _, t in old if t > sent),
        "ledger_gap": second.get("gap_seconds"), "restore": second.get("restore_seconds"),
        "standby": (rows[0].get("standby") or {}).get("outcome"),
        **{phase: (None if at is None else round(at - last, 2)) for phase, at in zip(GANG_PHASES, milestones)},
    }


def goodput_run(bench: Bench, root: Path, profile: dict, cycles: int, period_s: float) -> dict:
    """One job preempted every ``period_s`` (AWS profile, trained through); its goodput in steady state."""
    folder = root / "goodput"
    folder.mkdir()
    (folder / "train.py").write_text(TRAINEE)
    (folder / "job.yaml").write_text(yaml.safe_dump({
        "name": "goodput", "setup": f"sleep {profile['setup_s']:.2f}", "run": "python train.py",
        "env": {"BENCH_STATE_MB": str(profile["checkpoint_mb"])},
        "resources": {"cloud": ["local"]},
        "checkpoint": {"interval": "60s", "keep": 2},
        "recovery": {"resume_drill": "off", "prepare_on": ["notice"], "max_preemptions": cycles + 5},
    }))
    job_id = bench.cli_json("submit", str(folder / "job.yaml"))["id"]
    wait_until(lambda: re.search(r"^step 20 at", bench.cli("logs", job_id).stdout, re.M), 1800, "step 20", poll=0.5)
    start = bench.cli_json("status", job_id)["goodput"]
    started = time.time()
    for cycle in range(cycles):
        attempt = cycle + 1
        time.sleep(max(0.0, started + cycle * period_s - time.time()))
        bench.cli("preempt", job_id, "--notice", "aws")
        wait_until(lambda: len(STEP.findall(bench.cli("logs", job_id, "--attempt", str(attempt + 1),
                                                      check=False).stdout)) >= 5,
                   1800, f"attempt {attempt + 1}'s steps", poll=1.0)
        print(f"goodput: preemption {cycle + 1} of {cycles} done", flush=True)
    time.sleep(max(0.0, started + cycles * period_s - time.time()))
    time.sleep(6)  # the newest telemetry report (every 5 s) carries the last step
    end = bench.cli_json("status", job_id)["goodput"]
    rows = bench.cli_json("restarts", job_id)
    bench.cli("cancel", job_id)
    paid = end["paid_seconds"] - start["paid_seconds"]
    training = end["training_seconds"] - start["training_seconds"]
    return {"cycles": cycles, "period_s": period_s, "steady_ratio": training / paid if paid else None,
            "paid_s": paid, "training_s": training, "redone_s": end["redone_seconds"] - start["redone_seconds"],
            "whole_job_ratio": end.get("ratio"), "gaps": [r.get("gap_seconds") for r in rows[1:]]}


def _median(rows: list[dict], key: str):
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def _fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _bench(name: str, profile: dict, scale: float, under: str | None = None) -> tuple[Path, Bench]:
    """A controller of its own whose local market has the profile's boot and durable bandwidth."""
    root = Path(tempfile.mkdtemp(prefix=f"cloud-recovery-{name}-", dir=under))
    bench = Bench(root, time_scale=scale)
    config = yaml.safe_load((bench.home / "config.yaml").read_text())
    config["clouds"]["local"].update(boot_seconds=profile["boot_s"], durable_mb_per_s=profile["mb_per_s"])
    (bench.home / "config.yaml").write_text(yaml.safe_dump(config))
    return root, bench


def _discard(root: Path, keep: bool) -> None:
    if keep:
        print(f"kept: {root}", flush=True)
    else:
        shutil.rmtree(root, ignore_errors=True)


def _gang_table(args, base: dict) -> None:
    profile = scaled(base, args.scale)
    root, bench = _bench("gang", profile, args.scale, args.root)
    results: dict[str, list[dict]] = {path: [] for path in PATHS}
    try:
        bench.start()
        for i in range(args.count):
            for path, prepare_on in PATHS.items():
                job = f"gang-{'through' if prepare_on == '[notice]' else 'baseline'}-{i}"
                results[path].append(gang_trial(bench, root, job, prepare_on, profile, args.gang))
                print(f"gang of {args.gang} / {path}: {results[path][-1]}", flush=True)
    finally:
        bench.shutdown()
        _discard(root, args.keep)
    base_gap = _median(results["stop at once"], "gap")
    print(f"\n| {args.gang}-node gang, AWS profile at {args.scale:g}x | gap s | gap / stop at once | steps after the "
          f"notice | steps redone | ledger gap s | " + " | ".join(f"{p} (s after the last step)" for p in GANG_PHASES)
          + " |")
    print("| --- |" + " ---: |" * (5 + len(GANG_PHASES)))
    for path, rows in results.items():
        gap = _median(rows, "gap")
        print(f"| {path} | {_fmt(gap)} | {_fmt(gap / base_gap if base_gap else None, 2)} | "
              f"{_fmt(_median(rows, 'after_notice'), 0)} | {_fmt(_median(rows, 'redone'), 0)} | "
              f"{_fmt(_median(rows, 'ledger_gap'))} | " + " | ".join(_fmt(_median(rows, p)) for p in GANG_PHASES) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default="aws,gcp")
    parser.add_argument("--count", type=int, default=1, help="trials per profile and path (interleaved)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every duration and the checkpoint size")
    parser.add_argument("--goodput", type=int, default=0, metavar="N",
                        help="also: an AWS-profile job preempted every 10 minutes (times --scale), N times")
    parser.add_argument("--gang", type=int, default=0, metavar="N",
                        help="also: the AWS profile's two paths for an N-node torchrun gang (node 1 noticed)")
    parser.add_argument("--root", default=None, metavar="DIR",
                        help="where the controller's home, the nodes' local tiers and the durable tier live (default: "
                             "the temporary folder). A cloud GPU node's local disk writes GB/s: where this machine's "
                             "disk is slower than the durable tier's bandwidth, put them in memory (/dev/shm)")
    parser.add_argument("--keep", action="store_true",
                        help="keep each controller's folder (its home, the nodes' agent logs, the tiers) and print it")
    args = parser.parse_args(argv)
    names = [p for p in args.profiles.split(",") if p and p != "none"]
    unknown = [p for p in names if p not in PROFILES]
    if unknown or args.count < 1 or args.scale <= 0 or args.gang == 1 or args.gang < 0:
        parser.error(f"profiles are {', '.join(PROFILES)}; --count >= 1; --scale > 0; --gang 0 or >= 2")
    print(f"machine: {machine()}; scale {args.scale:g}; files under {args.root or tempfile.gettempdir()}", flush=True)
    table = []
    if args.goodput > 0:
        profile = scaled(PROFILES["aws"], args.scale)
        root, bench = _bench("goodput", profile, args.scale, args.root)
        try:
            bench.start()
            result = goodput_run(bench, root, profile, args.goodput, 600 * args.scale)
        finally:
            bench.shutdown()
            _discard(root, args.keep)
        print(f"goodput (AWS profile at {args.scale:g}x, a preemption every {600 * args.scale:g} s, {args.goodput} "
              f"times): {result}", flush=True)
    for name in names:
        profile = scaled(PROFILES[name], args.scale)
        root, bench = _bench(name, profile, args.scale, args.root)
        results: dict[str, list[dict]] = {path: [] for path in PATHS}
        try:
            bench.start()
            for i in range(args.count):
                for path, prepare_on in PATHS.items():
                    job = f"{name}-{'through' if prepare_on == '[notice]' else 'baseline'}-{i}"
                    results[path].append(trial(bench, root, job, prepare_on, profile))
                    print(f"{name} / {path}: {results[path][-1]}", flush=True)
        finally:
            bench.shutdown()
            _discard(root, args.keep)
        base = _median(results["stop at once"], "gap")
        for path, rows in results.items():
            gap = _median(rows, "gap")
            table.append((name, profile, path, gap, gap / base if base else None, rows))
    if args.gang:
        _gang_table(args, PROFILES["aws"])
    print(f"\n| profile (notice / boot / setup / checkpoint at {args.scale:g}x) | path | gap s | gap / stop at once "
          f"| steps after the notice | steps redone | ledger gap s | boot s | setup s | restore s | goodput |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, profile, path, gap, ratio, rows in table:
        label = (f"{name} ({profile['notice_s']:g} s / {profile['boot_s']:g} s / {profile['setup_s']:g} s / "
                 f"{profile['checkpoint_mb']:g} MB at {profile['mb_per_s']:g} MB/s)")
        print(f"| {label} | {path} | {_fmt(gap)} | {_fmt(ratio, 2)} | {_fmt(_median(rows, 'after_notice'), 0)} | "
              f"{_fmt(_median(rows, 'redone'), 0)} | {_fmt(_median(rows, 'ledger_gap'))} | {_fmt(_median(rows, 'boot'))} "
              f"| {_fmt(_median(rows, 'setup'))} | {_fmt(_median(rows, 'restore'))} | {_fmt(_median(rows, 'goodput'), 3)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
