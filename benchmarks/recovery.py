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

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.report import machine, percentile  # noqa: E402

from runner.durations import parse_duration  # noqa: E402
from runner.providers.local.processes import kill_session, ref_alive  # noqa: E402
from runner.providers.local.provider import GRACE_SECONDS  # noqa: E402

TRAIN = REPO / "examples" / "quickstart" / "train.py"
GOAL_SECONDS = 10.0

# Runs in the job: the job's own train.py with every printed line also appended, timestamped, to a trace
# file on the host (the node's scratch folder dies with the node; the trace must not).
WRAPPER = '''\
import os, runpy, sys, time

_trace = open(os.environ["BENCH_TRACE"], "a", buffering=1)
_attempt = os.environ.get("BENCH_ATTEMPT") or os.environ.get("RUNNER_ATTEMPT", "0")


def _mark(text):
    _trace.write(f"{time.time():.6f} {_attempt} {text}\\n")


_mark("process-start")
import torch  # noqa: E402,F401 - train.py imports it first thing; timed here to split start-up from restore

_mark("torch-imported")


class _Tee:
    def __init__(self, stream):
        self.stream, self.pending = stream, ""

    def write(self, text):
        self.stream.write(text)
        self.pending += text
        while "\\n" in self.pending:
            line, self.pending = self.pending.split("\\n", 1)
            _mark(line)
        return len(text)

    def flush(self):
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


sys.stdout = _Tee(sys.stdout)
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
'''

JOB = """\
name: recovery-bench
run: python bench_wrap.py --steps 100000000 --step-time {step_time} --log-every 1 --interval {interval}
env: {{BENCH_TRACE: "{trace}"}}
resources: {{cloud: [local]}}
checkpoint: {{interval: {interval}, keep: 2}}
recovery: {{max_preemptions: 1000, max_failures: 0, resume_drill: "off"}}
"""

STEP = re.compile(r"^step (\d+) ")
RESUMED = re.compile(r"^resumed from step (\d+)")
STOPPING = re.compile(r"^stopping at step (\d+) for a preemption")

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


class BenchError(Exception):
    pass


# --- the job's trace ---------------------------------------------------------------------------------
@dataclass
class Line:
    t: float
    attempt: int
    text: str


class Trace:
    """Reads the trace file incrementally; lines are (time, attempt, text)."""

    def __init__(self, path: Path):
        self.path = path
        self.lines: list[Line] = []
        self._offset = 0
        self._partial = b""

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        for raw in complete:
            parts = raw.decode("utf-8", "replace").split(" ", 2)
            if len(parts) == 3:
                try:
                    self.lines.append(Line(float(parts[0]), int(parts[1]), parts[2]))
                except ValueError:
                    pass

    def of(self, attempt: int) -> list[Line]:
        return [line for line in self.lines if line.attempt == attempt]

    def first(self, attempt: int, pattern: re.Pattern) -> tuple[Line, re.Match] | None:
        for line in self.of(attempt):
            match = pattern.search(line.text)
            if match:
                return line, match
        return None

    def last_step(self, attempt: int) -> tuple[Line, int] | None:
        found = None
        for line in self.of(attempt):
            match = STEP.search(line.text) or STOPPING.search(line.text)
            if match and (found is None or int(match.group(1)) >= found[1]):
                found = (line, int(match.group(1)))
        return found

    def step_line(self, attempt: int, step: int) -> Line | None:
        for line in self.of(attempt):
            match = STEP.search(line.text)
            if match and int(match.group(1)) == step:
                return line
        return None

    def latest_attempt(self) -> int:
        return max((line.attempt for line in self.lines), default=0)


def wait_until(predicate, timeout: float, what: str, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")


# --- the controller and the CLI ------------------------------------------------------------------------
class Bench:
    """A controller with its own RUNNER_HOME, the CLI pointed at it, and cleanup of everything started."""

    def __init__(self, root: Path, time_scale: float):
        self.root = root
        self.home = root / "home"
        self.home.mkdir()
        (self.home / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": time_scale}}}))
        self.controller: subprocess.Popen | None = None
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
        self.env.update({"RUNNER_HOME": str(self.home), "PYTHONUNBUFFERED": "1"})

    def start(self, timeout: float = 60.0) -> None:
        (self.home / "controller.json").unlink(missing_ok=True)
        with open(self.root / "controller.out", "ab") as out:
            self.controller = subprocess.Popen(
                [sys.executable, "-m", "runner.cli.main", "server", "--data-dir", str(self.home), "--port", "0"],
                env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=self.root,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.controller.poll() is not None:
                raise BenchError(f"the controller exited: {(self.root / 'controller.out').read_text()[-2000:]}")
            try:
                info = json.loads((self.home / "controller.json").read_text())
                token = (self.home / "admin-token").read_text().strip()
            except (OSError, ValueError):
                time.sleep(0.1)
                continue
            self.env.update({"RUNNER_SERVER": info["url"], "RUNNER_TOKEN": token})
            if self.cli("jobs", "--json", check=False, timeout=20).returncode == 0:
                return
            time.sleep(0.2)
        raise BenchError("the controller did not start")

    def cli(self, *args: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess:
        try:
            result = subprocess.run([sys.executable, "-m", "runner.cli.main", *args], capture_output=True,
                                    text=True, timeout=timeout, env=self.env, cwd=self.root, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise BenchError(f"runner {' '.join(args)} did not answer within {timeout:.0f} s") from None
        if check and result.returncode != 0:
            raise BenchError(f"runner {' '.join(args)} exited {result.returncode}: {result.stderr.strip()[-500:]}")
        return result

    def cli_json(self, *args: str):
        out = self.cli(*args, "--json").stdout
        try:
            return json.loads(out)
        except ValueError:
            raise BenchError(f"runner {' '.join(args)} --json printed no JSON: {out[:200]!r}") from None

    def db(self) -> sqlite3.Connection:
        """The controller's database, read-only (its float timestamps are finer than the API's)."""
        conn = sqlite3.connect(f"file:{self.home / 'runner.db'}?mode=ro", uri=True, timeout=10)
        conn.row_factory = sqlite3.Row
        return conn

    def node_ref(self, node_id: str) -> str:
        return (self.home / "nodes" / node_id / "ref").read_text()

    def shutdown(self) -> None:
        """Stop the controller, then every simulated node it started; nothing is left running."""
        if self.controller is not None and self.controller.poll() is None:
            self.controller.send_signal(signal.SIGTERM)
            try:
                self.controller.wait(15)
            except subprocess.TimeoutExpired:
                _kill_group(self.controller.pid)
                self.controller.wait(5)
        for ref_file in self.home.glob("nodes/*/ref"):
            try:
                ref = ref_file.read_text()
            except OSError:
                continue
            if ref_alive(ref):
                kill_session(int(ref.split(":")[0]))
        # A node the controller was spawning when it stopped may not have written its ref yet: find any
        # process whose command line names our temporary folder (only our own children do) and end its session.
        for pid in _processes_naming(str(self.root)):
            try:
                sid = os.getsid(pid)
            except ProcessLookupError:
                continue
            if sid != os.getsid(0):
                kill_session(sid)
            else:
                _kill(pid)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _processes_naming(text: str) -> list[int]:
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


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
