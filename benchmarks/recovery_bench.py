"""The recovery benchmark's test bench: a controller and CLI under a temporary RUNNER_HOME, and the trace
the job writes (every printed line, timestamped, to a file that outlives the node)."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runner.providers.local.processes import kill_session, ref_alive  # noqa: E402

TRAIN = REPO / "examples" / "quickstart" / "train.py"

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
