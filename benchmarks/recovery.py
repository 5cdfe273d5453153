"""Recovery time: from a preemption notice to training resumed on a new local node (goal: <= 10 s).

A real controller (``runner server``) with its own temporary RUNNER_HOME runs a small real PyTorch job
(examples/quickstart/train.py, logging every step, resume drill off) on the local provider. Each trial
waits until the current attempt is training, then interrupts it:

* **notice** (``aws``, ``gcp``, ``azure``): ``runner preempt JOB --notice CLOUD``: the notice goes through
  the node's own fake metadata server, the agent's watcher sees it, the job takes an emergency
  checkpoint and stops, the node is released and the job resumes on a new node;
* **kill**, the baseline measured in the same run: the node's whole process session is SIGKILLed with no
  notice (a spot VM that just vanishes); the controller finds out only through its reconciler, and the
  job resumes from its last periodic checkpoint (``--interval``). The kills are spread over the
  checkpoint interval (stratified random phases after the attempt's restore), so the work they lose
  samples what an unannounced loss costs: half an interval on average.

The clock runs from the moment the notice was put on the metadata server (the controller's ``chaos``
event) or the node was killed, to the moment the new attempt's training process prints ``resumed from
step N``. The job is the quickstart's train.py, copied unchanged into a job folder and started through a
small wrapper that imports torch (timed, to split start-up from restore) and appends every line the job
prints, with its time, to a trace file outside the node. Phases come from that trace, from the
controller's own records (events, attempts and nodes, read from its SQLite database read-only: their
timestamps are finer than the API's) and from the old node's agent log: notice detected by the agent,
emergency checkpoint committed (the job says so), training process exited, attempt ended (the agent's
exit report, or the reconciler finding the node gone), old node released, new node launched (the
provider's launch returned), agent registered, training process started, torch imported, resumed. Work
lost is the number of steps the next attempt does again (the last step the old attempt printed minus the
step it resumed from) and the training seconds those steps took.

The floor, measured first in the same run: the same wrapper and train.py started by hand (no runner),
resuming from a local checkpoint: what any restart of this job costs, whoever does it.

All trials share one job (one attempt per trial); trials of the different paths are interleaved. The
controller and every simulated node are stopped and the temporary folder removed at the end, also on
Ctrl-C or an error (``--keep`` keeps the folder, with the controller's and agents' logs).

    python benchmarks/recovery.py [--count 3] [--protocols aws,gcp,azure] [--time-scale 0.1]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.report import machine, percentile  # noqa: E402

from runner.durations import parse_duration  # noqa: E402
from runner.providers.local.processes import kill_session  # noqa: E402
from runner.providers.local.provider import GRACE_SECONDS  # noqa: E402

from benchmarks.recovery_bench import (  # noqa: E402
    JOB, RESUMED, STOPPING, TRAIN, WRAPPER, Bench, BenchError, Trace, wait_until,
)

GOAL_SECONDS = 10.0

# Milestones in order; a phase is the time from the previous milestone a trial has to this one.
PHASES = [
    ("detected", "watcher saw the notice"),
    ("committed", "emergency checkpoint committed"),
    ("exited", "training process exited"),
    ("ended", "attempt ended (exit / loss found)"),
    ("released", "old node released"),
    ("launched", "new node launched"),
    ("registered", "new agent registered"),
    ("started", "training process started"),
    ("imported", "torch imported"),
    ("resumed", "resumed from the checkpoint"),
]


# --- trials -------------------------------------------------------------------------------------------
@dataclass
class Trial:
    path: str            # aws | gcp | azure | kill
    old: int             # the attempt that was interrupted
    sent: float          # notice put on the metadata server, or the kill
    cli_seconds: float = 0.0
    new: int | None = None
    milestones: dict = field(default_factory=dict)
    last_step: int | None = None
    resumed_step: int | None = None
    steps_redone: int | None = None
    work_redone_s: float | None = None
    end_reason: str | None = None
    acked: bool | None = None  # the job acknowledged the emergency checkpoint before the agent's margin
    log_lost_s: float | None = None  # the restart log's lost_seconds for the old attempt
    error: str | None = None

    @property
    def total(self) -> float | None:
        resumed = self.milestones.get("resumed")
        return None if resumed is None else resumed - self.sent

    def phases(self) -> dict[str, float]:
        out, previous = {}, self.sent
        for name, _ in PHASES:
            at = self.milestones.get(name)
            if at is not None:
                out[name] = at - previous
                previous = at
        return out


def wait_training(trace: Trace, warmup: float, timeout: float) -> int:
    """Wait until the newest attempt has printed training steps for ``warmup`` seconds; return it."""
    def ready():
        trace.poll()
        attempt = trace.latest_attempt()
        start = trace.first(attempt, RESUMED) or trace.first(attempt, re.compile(r"^starting fresh"))
        last = trace.last_step(attempt)
        if attempt and start and last and last[0].t - start[0].t >= warmup:
            return attempt
        return None

    return wait_until(ready, timeout, "the job to print training steps")


def run_trial(bench: Bench, trace: Trace, job_id: str, path: str, args, phase: float = 0.0) -> Trial:
    """One interruption of the running attempt and the wait for the next one to resume.

    ``phase`` (kill only, 0..1) places the kill at that fraction of a checkpoint interval after the attempt
    restored its checkpoint (the periodic saves run from there), so the work lost samples what an
    unannounced loss costs on average: half an interval."""
    old = wait_training(trace, args.warmup, args.timeout)
    if path == "kill":
        node = bench.cli_json("status", job_id)["node"]
        trace.poll()
        begun = trace.first(old, RESUMED) or trace.first(old, re.compile(r"^starting fresh"))
        if trace.latest_attempt() != old or node is None or begun is None:
            raise BenchError("the attempt changed while preparing to kill its node")
        offset = phase * args.interval_s
        if begun[0].t + offset < time.time() + 0.05:  # too early for this attempt: the same phase, one interval on
            offset += args.interval_s
        time.sleep(max(0.0, min(begun[0].t + offset - time.time(), 2 * args.interval_s)))
        sid = int(bench.node_ref(node["id"]).split(":")[0])
        trial = Trial(path, old, time.time())
        kill_session(sid)
    else:
        before = time.time()
        bench.cli("preempt", job_id, "--notice", path)
        trial = Trial(path, old, before, cli_seconds=time.time() - before)

    def resumed():
        trace.poll()
        for attempt in range(old + 1, trace.latest_attempt() + 1):
            if trace.first(attempt, RESUMED):
                return attempt
        return None

    trial.new = wait_until(resumed, args.timeout, f"attempt {old} to resume on a new node")
    return trial


def fill_in(trial: Trial, trace: Trace, conn: sqlite3.Connection, home: Path, job_id: str) -> None:
    """Milestones from the controller's records and the job's trace; work lost."""
    old, new = trial.old, trial.new
    events = conn.execute("SELECT * FROM events WHERE job_id = ? ORDER BY id", (job_id,)).fetchall()
    attempts = {row["attempt"]: row for row in conn.execute("SELECT * FROM attempts WHERE job_id = ?", (job_id,))}
    nodes = {row["id"]: row for row in conn.execute("SELECT * FROM nodes WHERE job_id = ?", (job_id,))}
    m = trial.milestones

    if trial.path != "kill":
        chaos = [e for e in events if e["kind"] == "chaos" and e["attempt"] == old]
        if chaos:
            trial.sent = chaos[0]["time"]  # the notice is on the metadata server (not the CLI's start-up)
        notice = [e for e in events if e["kind"] == "notice" and e["attempt"] == old]
        if notice:
            m["detected"] = notice[0]["time"]
        stopping = trace.first(old, STOPPING)
        if stopping:
            m["committed"] = stopping[0].t
    row = attempts.get(old)
    if row is not None:
        trial.end_reason = row["end_reason"]
        trial.log_lost_s = row["lost_seconds"]
        m["ended"] = row["ended_at"]
        node = nodes.get(row["node_id"])
        if node is not None and node["terminated_at"]:
            m["released"] = node["terminated_at"]
        if trial.path != "kill":
            agent = agent_log(home / "nodes" / row["node_id"] / "agent.jsonl")
            exited = [t for t, event in agent if event == "process exited"]
            if exited:
                m["exited"] = exited[-1]
            if any(event == "emergency checkpoint acknowledged" for _, event in agent):
                trial.acked = True
            elif any(event.startswith("no acknowledgement") for _, event in agent):
                trial.acked = False
    row = attempts.get(new)
    if row is not None:
        node = nodes.get(row["node_id"])
        launched = [e for e in events if e["kind"] == "state" and e["to_state"] == "PROVISIONING"
                    and (e["message"] or "").startswith(f"attempt {new} ")]
        m["launched"] = launched[0]["time"] if launched else (node["created_at"] if node is not None else None)
        m["registered"] = (node["registered_at"] if node is not None else None) or row["running_at"]
    start = trace.first(new, re.compile(r"^process-start$"))
    if start:
        m["started"] = start[0].t
    imported = trace.first(new, re.compile(r"^torch-imported$"))
    if imported:
        m["imported"] = imported[0].t
    resumed = trace.first(new, RESUMED)
    if resumed:
        m["resumed"] = resumed[0].t
        trial.resumed_step = int(resumed[1].group(1))
    for key in [k for k, v in m.items() if v is None]:
        del m[key]

    last = trace.last_step(old)
    if last and trial.resumed_step is not None:
        trial.last_step = last[1]
        trial.steps_redone = max(0, last[1] - trial.resumed_step)
        # the training time those steps took on the old attempt
        origin = trace.step_line(old, trial.resumed_step)
        if origin is None:
            origin_match = trace.first(old, RESUMED) or trace.first(old, re.compile(r"^starting fresh"))
            origin = origin_match[0] if origin_match else None
        if origin is not None:
            trial.work_redone_s = max(0.0, last[0].t - origin.t) if trial.steps_redone else 0.0


def agent_log(path: Path) -> list[tuple[float, str]]:
    """(unix time, event) of each line of an agent's JSON log; the node folder outlives the node."""
    out = []
    try:
        text = path.read_text()
    except OSError:
        return out
    for raw in text.splitlines():
        try:
            entry = json.loads(raw)
            stamp = datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        out.append((stamp, str(entry.get("event", ""))))
    return out


# --- report -------------------------------------------------------------------------------------------




def report(trials: list[Trial], floor: list[dict], paths: list[str], args, elapsed: float,
           load: tuple[float, float]) -> None:
    ok = {p: [t for t in trials if t.path == p and t.total is not None] for p in paths}
    grace = ", ".join(f"{c} {GRACE_SECONDS[c] * args.time_scale:g} s" for c in paths if c in GRACE_SECONDS)
    print(f"\nRecovery: interruption -> training resumed on a new local node; {args.count} per path; "
          f"time_scale {args.time_scale:g} (grace: {grace});\ncheckpoint interval {args.interval}; "
          f"{elapsed:.0f} s run; load average {load[0]:.2f} at the start, {load[1]:.2f} at the end")
    print(f"machine: {machine()}\n")

    width = 10
    header = f"{'seconds':38}" + "".join(f"{p + ' p50':>{width}}{p + ' max':>{width}}" for p in paths)
    print(header)
    print("-" * len(header))

    def row(label: str, values_of, digits: int = 2) -> None:
        cells = ""
        for p in paths:
            values = [v for v in (values_of(t) for t in ok[p]) if v is not None]
            if values:
                cells += f"{percentile(values, 50):>{width}.{digits}f}{max(values):>{width}.{digits}f}"
            else:
                cells += f"{'-':>{width}}{'-':>{width}}"
        print(f"{label:38}{cells}")

    for name, label in PHASES:
        row(f"-> {label}", lambda t, name=name: t.phases().get(name))
    print("-" * len(header))
    row("time to resume (interruption->resumed)", lambda t: t.total)
    row("work lost: steps redone", lambda t: t.steps_redone, digits=0)
    row("work lost: training seconds redone", lambda t: t.work_redone_s)
    row("  (restart log's lost_seconds)", lambda t: t.log_lost_s)
    row("time to resume + work redone", lambda t: t.total + (t.work_redone_s or 0.0))
    print()

    for p in paths:
        done = ok[p]
        failed = [t for t in trials if t.path == p and t.total is None]
        if not done:
            print(f"{p:6} no recovery measured ({len(failed)} failed, {args.count - len(failed)} not run)")
            continue
        p50, worst = percentile([t.total for t in done], 50), max(t.total for t in done)
        reasons = sorted({t.end_reason for t in done if t.end_reason})
        line = (f"{p:6} n={len(done)}{f' ({len(failed)} failed)' if failed else ''}: time to resume p50 "
                f"{p50:.2f} s, max {worst:.2f} s")
        if p != "kill":
            line += f" (goal <= {GOAL_SECONDS:g} s: {'met' if worst <= GOAL_SECONDS else 'NOT met'})"
            line += f"; acknowledged before the deadline {sum(1 for t in done if t.acked)}/{len(done)}"
        print(line + f"; end_reason {'/'.join(reasons)}")

    if floor:
        totals = [f["resumed"] for f in floor]
        f50 = percentile(totals, 50)
        print(f"\nfloor: the same train.py started by hand and resuming from a local checkpoint, {len(floor)} runs: "
              f"spawn -> resumed p50 {f50:.2f} s (process started {percentile([f['started'] for f in floor], 50):.2f}, "
              f"torch imported {percentile([f['imported'] for f in floor], 50):.2f})")
        for p in paths:
            if ok[p]:
                p50 = percentile([t.total for t in ok[p]], 50)
                print(f"  {p:6} time to resume p50 {p50:.2f} s = floor {f50:.2f} s + {p50 - f50:.2f} s "
                      f"({(p50 - f50) / p50:.0%}) for the rest of the recovery path")

    if "kill" in paths and ok["kill"]:
        kill = ok["kill"]

        def p50_of(done, fn):
            return percentile([fn(t) for t in done], 50)

        k_total = p50_of(kill, lambda t: t.total)
        k_steps = p50_of(kill, lambda t: t.steps_redone or 0)
        k_back = p50_of(kill, lambda t: t.total + (t.work_redone_s or 0.0))
        print("\nbaseline (kill, no notice) / notice path, p50:")
        for p in paths:
            if p == "kill" or not ok[p]:
                continue
            n_total = p50_of(ok[p], lambda t: t.total)
            n_steps = p50_of(ok[p], lambda t: t.steps_redone or 0)
            n_back = p50_of(ok[p], lambda t: t.total + (t.work_redone_s or 0.0))
            steps = f"{k_steps / n_steps:.1f}x" if n_steps else f"{k_steps:.0f} vs {n_steps:.0f}"
            print(f"  kill / {p:5}: time to resume {k_total / n_total:4.2f}x; steps redone {steps}; "
                  f"time to resume + work redone {k_back / n_back:4.2f}x")
    print(f"\nA phase runs from the previous milestone its path has; the kill path's first is kill -> the "
          f"reconciler finds\nthe node gone. Goal: time to resume <= {GOAL_SECONDS:g} s for every notice.")


def measure_floor(root: Path, count: int, timeout: float) -> list[dict]:
    """The job's own start-up: train.py (through the same wrapper) started by hand, resuming from a local
    checkpoint, outside the runner. Seconds from spawning it to: process started, torch imported, resumed."""
    folder = root / "floor"
    folder.mkdir()
    shutil.copy(TRAIN, folder / "train.py")
    (folder / "bench_wrap.py").write_text(WRAPPER)
    trace = Trace(root / "floor-trace.log")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    env.update({"BENCH_TRACE": str(trace.path), "PYTHONUNBUFFERED": "1"})
    command = [sys.executable, "bench_wrap.py", "--steps", "20", "--step-time", "0", "--interval", "1h"]
    out = []
    for run in range(count + 1):  # the first run writes the checkpoint the others resume from
        spawned = time.time()
        try:
            done = subprocess.run(command, cwd=folder, env={**env, "BENCH_ATTEMPT": str(run)}, timeout=timeout,
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            raise BenchError(f"train.py by hand did not finish within {timeout:.0f} s") from None
        if done.returncode != 0:
            raise BenchError(f"train.py by hand exited {done.returncode}: {done.stderr[-500:]}")
        trace.poll()
        if run == 0:
            continue
        marks = {}
        for key, pattern in (("started", r"^process-start$"), ("imported", r"^torch-imported$"),
                             ("resumed", RESUMED.pattern)):
            found = trace.first(run, re.compile(pattern))
            if found is None:
                raise BenchError(f"train.py by hand never printed {pattern!r}")
            marks[key] = found[0].t - spawned
        out.append(marks)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=3, help="recoveries per path (default 3)")
    parser.add_argument("--protocols", default="aws,gcp,azure", help="notice protocols (default aws,gcp,azure)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the kill-without-notice baseline")
    parser.add_argument("--no-floor", action="store_true", help="skip timing train.py's start-up by hand")
    parser.add_argument("--time-scale", type=float, default=0.1,
                        help="the local provider's time scale: grace = the cloud's grace x this (default 0.1: "
                             "aws 12 s, gcp and azure 3 s; below 0.1 Azure's 1-s poll and 1-s NotBefore leave "
                             "the job no time to checkpoint)")
    parser.add_argument("--interval", default="10s", help="the job's periodic checkpoint interval (default 10s)")
    parser.add_argument("--step-time", type=float, default=0.05, help="train.py --step-time (default 0.05)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of training after a resume before the "
                        "next interruption (default 1)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds allowed for one recovery (default 60)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (controller, node and "
                        "agent logs) and print where it is")
    args = parser.parse_args(argv)
    protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    bad = [p for p in protocols if p not in GRACE_SECONDS]
    if bad or args.count < 1 or args.time_scale <= 0:
        parser.error(f"--protocols takes aws, gcp, azure; --count >= 1; --time-scale > 0 (got {args.protocols!r})")
    try:
        args.interval_s = parse_duration(args.interval)
    except ValueError as exc:
        parser.error(f"--interval: {exc}")
    paths = protocols + ([] if args.no_baseline else ["kill"])

    # SIGTERM and SIGHUP end the run like Ctrl-C: through the cleanup below (unless the caller ignores them).
    def interrupted(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, interrupted)

    root = Path(tempfile.mkdtemp(prefix="runner-recovery-"))
    bench = Bench(root, args.time_scale)
    trace = Trace(root / "trace.log")
    rng = random.Random(args.seed)
    trials: list[Trial] = []
    started, load_start = time.monotonic(), os.getloadavg()[0]
    code = 0
    try:
        folder = root / "job"
        folder.mkdir()
        shutil.copy(TRAIN, folder / "train.py")
        (folder / "bench_wrap.py").write_text(WRAPPER)
        (folder / "job.yaml").write_text(JOB.format(step_time=args.step_time, interval=args.interval,
                                                    trace=root / "trace.log"))
        floor = [] if args.no_floor else measure_floor(root, args.count, args.timeout)
        bench.start()
        job_id = bench.cli_json("submit", str(folder / "job.yaml"))["id"]
        print(f"controller up, job {job_id} submitted; {len(paths) * args.count} recoveries to measure",
              file=sys.stderr)
        order = [p for _ in range(args.count) for p in paths]
        # Kill phases stratified over the checkpoint interval, in a random order: one per count-th of it.
        phases = [(i + rng.random()) / args.count for i in range(args.count)]
        rng.shuffle(phases)
        for index, path in enumerate(order, 1):
            try:
                trial = run_trial(bench, trace, job_id, path, args, phases.pop() if path == "kill" else 0.0)
            except BenchError as exc:
                trials.append(Trial(path, trace.latest_attempt(), time.time(), error=str(exc)))
                print(f"[{index}/{len(order)}] {path}: FAILED: {exc}; stopping here", file=sys.stderr)
                code = 1
                break  # the job may be stuck or gone: later trials would only time out as well
            trials.append(trial)
            print(f"[{index}/{len(order)}] {path}: attempt {trial.old} -> {trial.new}", file=sys.stderr)
        with contextlib.closing(bench.db()) as conn:
            for trial in trials:
                if trial.new is not None:
                    fill_in(trial, trace, conn, bench.home, job_id)
        logs = bench.cli("logs", job_id, timeout=120).stdout
        resumed_in_logs = len(re.findall(r"^resumed from step \d+", logs, re.M))
        expected = sum(1 for t in trials if t.new is not None)
        if resumed_in_logs < expected:
            print(f"warning: `runner logs` shows {resumed_in_logs} resumes, the trace {expected}", file=sys.stderr)
        bench.cli("cancel", job_id, check=False)
        report(trials, floor, paths, args, time.monotonic() - started, (load_start, os.getloadavg()[0]))
        if any(t.error for t in trials):
            print("\nfailed trials:\n" + "\n".join(f"  {t.path}: {t.error}" for t in trials if t.error))
    except KeyboardInterrupt:
        print("\ninterrupted; stopping the controller and the nodes", file=sys.stderr)
        code = 130
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 1
    finally:
        # Nothing may interrupt the cleanup: hold off Ctrl-C and SIGTERM until it is done.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
        try:
            bench.shutdown()
        finally:
            if args.keep:
                print(f"kept {root}", file=sys.stderr)
            else:
                shutil.rmtree(root, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
