"""Elastic gang benchmark, market level: a real controller on the local market, a 3-node torchrun gang (one DDP
process per node, gloo on CPU: ``tests/e2e/elastic_train.py``), node 1 preempted; the elastic gang
(``resources.min_nodes: 2``) against the same job without ``min_nodes`` (stop and resume), in one run.

A controller of its own (benchmarks/recovery_bench.py's Bench) runs the local market with
``clouds.local.boot_seconds`` set (``--boot``): a launched node's agent starts that long after the launch, so
the survivors of an elastic gang train on 2 nodes while the replacement boots. Torchrun runs a small wrapper that
times every ``Checkpointer.step()`` of the training script into a trace file on the host (time, attempt, the node's
rank, pid, step, world size), so every figure comes from the job's own clock.

Elastic path (one job): full width until ``--warm`` steps are done, then ``runner preempt JOB --node 1 --notice
aws``; the survivors shrink to 2 at an agreed step, train while the replacement boots, and grow back to 3 when it
joins. Then (``--vanish``, default on) ``runner preempt JOB --node 2 --notice none``: the node vanishes, the
survivors shrink again after the controller notices. Baseline (another job, same shape, no ``min_nodes``): the
same notice; the gang stops and the next attempt resumes from the checkpoint.

Figures (node 0's process, which never leaves):

* steps/s at full width (the ``--window`` seconds before the notice) and at 2 while the replacement boots; the goal
  is the job's samples/s ≥ 0.9 × 2/3 of full width's, i.e. a rank's steps/s ≥ 0.9 × full width's (same batch per
  rank);
* shrink (notice): the agreed step's ``step()`` to the next step done (goal ≤ 5 s); the notice to the agreed step;
* shrink (vanish): the preempt command to the first step done in the world of 2 (goal ≤ 10 s);
* grow: the replacement's agent ready (its setup done, from the controller's database) to the first step
  done at full width (goal ≤ 5 s + the state's size at 100 MB/s; the state here is a tiny model);
* survivors' pids before and after; the restart log's world sizes;
* baseline: the last step of attempt 1 to the first step of attempt 2 (the training pause of stop and resume).

    python benchmarks/elastic_market.py [--boot 20] [--warm 100] [--window 10] [--no-vanish]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.recovery_bench import Bench, BenchError, wait_until  # noqa: E402
from benchmarks.report import machine  # noqa: E402

TRAIN = REPO / "tests" / "e2e" / "elastic_train.py"

# Runs under torchrun in every node: times each Checkpointer.step() of the training script into the host's trace.
WRAPPER = '''\
import os, runpy, sys, time

from runner.checkpoint import Checkpointer

_trace = open(os.environ["BENCH_TRACE"], "a", buffering=1)
_tag = f"{os.environ.get('RUNNER_ATTEMPT', '0')} {os.environ.get('RUNNER_NODE_RANK', '-1')} {os.getpid()}"


def _mark(text):
    _trace.write(f"{time.time():.6f} {_tag} {text}\\n")


_step, _restore = Checkpointer.step, Checkpointer.restore


def step(self, step, loss=None):
    _mark(f"done {step} {self.world_size}")  # the step's training is done; step() may change the world
    _step(self, step, loss)
    if self.world_changed:
        _mark(f"changed {step} {self.world_size}")


def restore(self, *args, **kwargs):
    _mark("restoring 0 0")  # the Checkpointer is built (its hello sent): a joiner now waits for its world
    result = _restore(self, *args, **kwargs)
    _mark(f"restored {result} {self.world_size}")
    return result


Checkpointer.step, Checkpointer.restore = step, restore
_mark("start 0 0")
sys.argv = ["elastic_train.py", *sys.argv[1:]]
runpy.run_path("elastic_train.py", run_name="__main__")
'''

JOB = {
    "run": ("torchrun --nnodes=$RUNNER_NUM_NODES --node-rank=$RUNNER_NODE_RANK --nproc-per-node=1 "
            "--master-addr=$RUNNER_MASTER_ADDR --master-port=$RUNNER_MASTER_PORT bench_wrap.py --steps 10000000 "
            "--step-time {step_time}"),
    "checkpoint": {"interval": "1h"},
    "recovery": {"resume_drill": "off", "max_failures": 0, "max_preemptions": 10},
}


@dataclass
class Mark:
    t: float
    attempt: int
    node: int
    pid: int
    kind: str
    step: int
    world: int


def read_trace(path: Path) -> list[Mark]:
    marks = []
    try:
        text = path.read_text()
    except FileNotFoundError:
        return marks
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 7:
            try:
                marks.append(Mark(float(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), parts[4],
                                  int(parts[5]) if parts[5].lstrip("-").isdigit() else -1, int(parts[6])))
            except ValueError:
                pass
    return marks


def done(marks: list[Mark], pid: int | None = None, attempt: int | None = None) -> list[Mark]:
    return [m for m in marks if m.kind == "done" and (pid is None or m.pid == pid)
            and (attempt is None or m.attempt == attempt)]


def rate(steps: list[Mark]) -> float | None:
    if len(steps) < 2 or steps[-1].t <= steps[0].t:
        return None
    return (len(steps) - 1) / (steps[-1].t - steps[0].t)


def submit(bench: Bench, root: Path, name: str, elastic: bool, step_time: float) -> tuple[str, Path]:
    folder = root / name
    folder.mkdir()
    shutil.copy(TRAIN, folder / TRAIN.name)
    (folder / "bench_wrap.py").write_text(WRAPPER)
    trace = root / f"{name}.trace"
    resources = {"cloud": ["local"], "num_nodes": 3, **({"min_nodes": 2} if elastic else {})}
    job = {"name": name, **JOB, "run": JOB["run"].format(step_time=step_time), "resources": resources,
           "env": {"BENCH_TRACE": str(trace), "OMP_NUM_THREADS": "1"}}
    (folder / "job.yaml").write_text(yaml.safe_dump(job))
    return bench.cli_json("submit", str(folder / "job.yaml"))["id"], trace


def node0_pid(trace: Path, attempt: int = 1) -> int:
    starts = [m for m in read_trace(trace) if m.kind == "restored" and m.node == 0 and m.attempt == attempt]
    return starts[0].pid if starts else 0


def world_sizes(bench: Bench, job_id: str) -> list[tuple[int, int]]:
    rows = bench.cli_json("restarts", job_id)
    return [(w["world_size"], w["step"]) for w in (rows[0].get("world_sizes") or [])] if rows else []


def wait_steps(trace: Path, pid: int, count: int, timeout: float, what: str) -> None:
    wait_until(lambda: len(done(read_trace(trace), pid)) >= count, timeout, what, poll=0.5)


def changes(trace: Path, pid: int) -> list[Mark]:
    return [m for m in read_trace(trace) if m.kind == "changed" and m.pid == pid]


def joined_node(bench: Bench, job_id: str, after: float) -> dict | None:
    """The first node that joined the attempt after ``after``: its rank and when its agent was ready."""
    with bench.db() as conn:
        rows = conn.execute(
            "SELECT a.rank, a.node_id, a.joined_at, n.created_at, n.registered_at, n.setup_ended_at "
            "FROM attempt_nodes a JOIN nodes n ON n.id = a.node_id WHERE a.job_id = ? AND n.created_at > ? "
            "ORDER BY n.created_at", (job_id, after)).fetchall()
        worlds = conn.execute("SELECT created_at FROM elastic_worlds WHERE job_id = ? AND reason LIKE 'joined%' "
                              "ORDER BY generation", (job_id,)).fetchall()
    if not rows:
        return None
    return {**dict(rows[0]), "world_issued_at": worlds[0]["created_at"] if worlds else None}


def elastic_trial(bench: Bench, root: Path, args) -> dict:
    job_id, trace = submit(bench, root, "elastic", True, args.step_time)
    wait_until(lambda: node0_pid(trace), 600, "the elastic gang's node 0 to start training", poll=1.0)
    pid0 = node0_pid(trace)
    wait_steps(trace, pid0, args.warm, 600, f"{args.warm} steps at full width")
    before = {m.node: m.pid for m in read_trace(trace) if m.kind == "restored"}
    notice_t = time.time()
    bench.cli("preempt", job_id, "--node", "1", "--notice", "aws")
    wait_until(lambda: len(changes(trace, pid0)) >= 1, 300, "the shrink", poll=0.5)
    shrink = changes(trace, pid0)[0]
    wait_until(lambda: len(changes(trace, pid0)) >= 2, 600, "the grow", poll=1.0)
    grow = changes(trace, pid0)[1]
    wait_until(lambda: any(m.step > grow.step + 5 for m in done(read_trace(trace), pid0)), 120, "steps after the grow")
    marks = read_trace(trace)
    steps0 = done(marks, pid0)
    full = [m for m in steps0 if notice_t - args.window <= m.t <= notice_t and m.world == 3]
    agreed = next(m for m in steps0 if m.step == shrink.step)
    after_shrink = next(m for m in steps0 if m.step == shrink.step + 1)
    narrow = [m for m in steps0 if shrink.step < m.step <= grow.step]
    first_full = next(m for m in steps0 if m.step == grow.step + 1)
    joiner = joined_node(bench, job_id, notice_t)
    # The replacement's agent is ready once it has registered and run setup (the job has none); its launcher and
    # training process start then (the wrapper's first mark comes after torch's import), the controller issues the
    # world once that process waits for it, and the survivors move at their next agreed step.
    ready = joiner and (joiner["setup_ended_at"] or joiner["registered_at"])
    joiner_marks = [m for m in marks if m.pid not in (pid0, before.get(1), before.get(2)) and m.t > notice_t]
    joiner_start = next((m.t for m in joiner_marks if m.kind == "start"), None)
    joiner_restored = next((m.t for m in joiner_marks if m.kind == "restored"), None)
    joiner_waits = next((m.t for m in joiner_marks if m.kind == "restoring"), None)
    result = {
        "job": job_id, "pid0": pid0,
        "full_steps_per_s": rate(full), "narrow_steps_per_s": rate(narrow),
        "notice_to_agreed_s": agreed.t - notice_t, "shrink_pause_s": after_shrink.t - agreed.t,
        "shrink_step": shrink.step, "grow_step": grow.step,
        "replacement_boot_s": (joiner["registered_at"] - joiner["created_at"]) if joiner and joiner["registered_at"] else None,
        "ready_to_full_s": (first_full.t - ready) if ready else None,
        "step_time_s": (1 / rate(full)) if rate(full) else None,
        "ready_to_process_start_s": (joiner_start - ready) if ready and joiner_start else None,
        "process_start_to_world_issued_s": (joiner["world_issued_at"] - joiner_start)
        if joiner and joiner["world_issued_at"] and joiner_start else None,
        "process_start_to_waiting_s": (joiner_waits - joiner_start) if joiner_waits and joiner_start else None,
        "waiting_to_world_issued_s": (joiner["world_issued_at"] - joiner_waits)
        if joiner and joiner["world_issued_at"] and joiner_waits else None,
        "waiting_to_full_s": (first_full.t - joiner_waits) if joiner_waits else None,
        "world_issued_to_full_s": (first_full.t - joiner["world_issued_at"]) if joiner and joiner["world_issued_at"] else None,
        "joiner_restored_to_full_s": (first_full.t - joiner_restored) if joiner_restored else None,
    }
    if args.vanish:
        vanish_t = time.time()
        bench.cli("preempt", job_id, "--node", "2", "--notice", "none")
        wait_until(lambda: len(changes(trace, pid0)) >= 3, 300, "the shrink after the vanish", poll=0.5)
        lost = changes(trace, pid0)[2]
        wait_until(lambda: any(m.step > lost.step for m in done(read_trace(trace), pid0)), 60, "a step after the loss")
        first_after = next(m for m in done(read_trace(trace), pid0) if m.step == lost.step + 1)
        last_before = max((m for m in done(read_trace(trace), pid0) if m.t <= vanish_t), key=lambda m: m.t)
        result.update(vanish_to_training_s=first_after.t - vanish_t, vanish_step_gap_s=first_after.t - last_before.t)
    marks = read_trace(trace)
    # A replacement's launcher is a gang of one (its RUNNER_NODE_RANK is 0 too): tell processes apart by pid. The
    # survivors kept their processes if the pids that trained at full width before the notice trained in the world
    # of 2 and again at full width after the grow, and every process that started belongs to them or a replacement.
    trained = {pid: {(m.world, m.t > grow.t) for m in done(marks, pid)} for pid in {m.pid for m in marks}}
    survivors = [before.get(0), before.get(2)]
    result["pids"] = {"survivors": survivors, "replacements": sorted(set(trained) - set(before.values()))}
    result["survivors_same_pid"] = all({(3, False), (2, False), (3, True)} <= trained.get(pid, set())
                                       for pid in survivors)
    result["world_sizes"] = world_sizes(bench, job_id)
    result["attempts"] = bench.cli_json("status", job_id)["attempts"]
    bench.cli("cancel", job_id, check=False)
    return result


def baseline_trial(bench: Bench, root: Path, args) -> dict:
    job_id, trace = submit(bench, root, "baseline", False, args.step_time)
    wait_until(lambda: node0_pid(trace), 600, "the baseline gang's node 0 to start training", poll=1.0)
    pid0 = node0_pid(trace)
    wait_steps(trace, pid0, args.warm, 600, f"{args.warm} steps at full width")
    notice_t = time.time()
    bench.cli("preempt", job_id, "--node", "1", "--notice", "aws")
    wait_until(lambda: len(done(read_trace(trace), attempt=2)) >= 20, 900, "attempt 2's steps", poll=1.0)
    marks = read_trace(trace)
    full = [m for m in done(marks, pid0) if notice_t - args.window <= m.t <= notice_t]
    last1 = max(done(marks, attempt=1), key=lambda m: m.t)
    first2 = min(done(marks, attempt=2), key=lambda m: m.t)
    bench.cli("cancel", job_id, check=False)
    return {"job": job_id, "full_steps_per_s": rate(full), "notice_to_last_step_s": last1.t - notice_t,
            "pause_s": first2.t - last1.t, "last_step": last1.step, "resumed_first_step": first2.step}


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boot", type=float, default=20.0, help="clouds.local.boot_seconds")
    parser.add_argument("--step-time", type=float, default=0.05, help="the training script's sleep per step")
    parser.add_argument("--warm", type=int, default=100, help="steps at full width before the notice")
    parser.add_argument("--window", type=float, default=10.0, help="seconds before the notice for full width's rate")
    parser.add_argument("--no-vanish", dest="vanish", action="store_false", help="skip the second (no notice) loss")
    parser.add_argument("--keep", metavar="DIR", help="copy the traces, the controller's output and the agents' logs here")
    parser.add_argument("--only", choices=["elastic", "baseline"], default=None)
    args = parser.parse_args(argv)
    load = os.getloadavg()
    print(f"machine: {machine()}; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; boot {args.boot:g} s",
          flush=True)
    root = Path(tempfile.mkdtemp(prefix="elastic-market-"))
    bench = Bench(root, time_scale=1.0)
    config = yaml.safe_load((bench.home / "config.yaml").read_text())
    config["clouds"]["local"]["boot_seconds"] = args.boot
    (bench.home / "config.yaml").write_text(yaml.safe_dump(config))
    elastic = base = None
    try:
        bench.start()
        if args.only != "baseline":
            elastic = elastic_trial(bench, root, args)
            print(f"elastic: {elastic}", flush=True)
        if args.only != "elastic":
            base = baseline_trial(bench, root, args)
            print(f"baseline: {base}", flush=True)
    except BenchError:
        print(f"controller output ends: {(root / 'controller.out').read_text()[-3000:]}", flush=True)
        raise
    finally:
        bench.shutdown()
        load = os.getloadavg()
        print(f"load average at the end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}", flush=True)
        if args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
            for name in ("elastic.trace", "baseline.trace", "controller.out"):
                if (root / name).exists():
                    shutil.copy(root / name, Path(args.keep) / name)
            for node_log in (bench.home / "nodes").glob("*/agent.jsonl"):  # each node's agent, for where time goes
                shutil.copy(node_log, Path(args.keep) / f"agent-{node_log.parent.name}.jsonl")
        shutil.rmtree(root, ignore_errors=True)
    base_pause = base["pause_s"] if base else None

    def vs(value):
        return _fmt(value / base_pause, 3) if value is not None and base_pause else "-"

    state_mb = 0.0  # Linear(8, 1) and its optimizer: bytes, not MB
    print("\n| figure | elastic | stop and resume | elastic / stop and resume | goal |")
    print("| --- | ---: | ---: | ---: | --- |")
    if elastic:
        full, narrow = elastic["full_steps_per_s"], elastic["narrow_steps_per_s"]
        print(f"| node 0 steps/s at full width | {_fmt(full)} | {_fmt(base and base['full_steps_per_s'])} | | |")
        print(f"| node 0 steps/s at 2 while the replacement boots / full width | {_fmt(narrow and full and narrow / full)} "
              f"| - | | ≥ 0.90 |")
        print(f"| notice to the agreed step, s | {_fmt(elastic['notice_to_agreed_s'])} | "
              f"{_fmt(base and base['notice_to_last_step_s'])} (to the last step) | | |")
        print(f"| training pause after the notice, s | {_fmt(elastic['shrink_pause_s'])} | {_fmt(base_pause)} | "
              f"{vs(elastic['shrink_pause_s'])} | ≤ 5 s |")
        if "vanish_to_training_s" in elastic:
            print(f"| vanish (no notice) to a step done at 2, s | {_fmt(elastic['vanish_to_training_s'])} | - | "
                  f"{vs(elastic['vanish_to_training_s'])} | ≤ 10 s |")
        print(f"| replacement's agent ready to a step done at 3, s | {_fmt(elastic['ready_to_full_s'])} | - | | "
              f"≤ {5 + state_mb / 100:.1f} s |")
        print(f"| … agent ready to its training process started (launcher, torch import), s | "
              f"{_fmt(elastic['ready_to_process_start_s'])} | | | |")
        print(f"| … process started to the world issued (waiting in restore), s | "
              f"{_fmt(elastic['process_start_to_world_issued_s'])} | | | |")
        print(f"| … … its script's start (imports done) to restore() called (the Checkpointer built), s | "
              f"{_fmt(elastic['process_start_to_waiting_s'])} | | | |")
        print(f"| … … restore() called to the world issued (its hello reaching the controller), s | "
              f"{_fmt(elastic['waiting_to_world_issued_s'])} | | | |")
        print(f"| … world issued to a step done at 3, s | {_fmt(elastic['world_issued_to_full_s'])} | | | |")
        print(f"| its training waiting in restore() to a step done at 3, s | {_fmt(elastic['waiting_to_full_s'])} "
              f"| | | |")
        print(f"| survivors' processes kept (same pids) | {elastic['survivors_same_pid']} | no (attempt 2) | | yes |")
        print(f"| attempts / world sizes | {elastic['attempts']} / {[w for w, _ in elastic['world_sizes']]} | 2 | | |")
    elif base:
        print(f"| training pause after the notice, s | - | {_fmt(base_pause)} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
