"""How many nodes one controller holds: N simulated nodes heartbeating at 1 Hz against the real controller.

The controller is `runner server`'s own ``serve()`` in a process of its own (so its CPU and memory are its
alone), on the in-memory provider: jobs are submitted through the real API, the scheduler launches them,
and every launched node's bootstrap (its id and token) is handed to this script, which plays the node's
agent over HTTP: it registers, then heartbeats once a second, ships a line of output every
``--log-every`` seconds and reports a durable checkpoint every ``--checkpoint-every`` seconds, each node
at its own phase. The load generator is one asyncio loop in this process; each node keeps its own
keep-alive connection, as an agent does. Its HTTP client is the few lines of :class:`NodeConnection`, not
aiohttp: on a 2-core machine the generator shares the CPU with the controller it measures, and aiohttp's
client costs about as much CPU a request as the controller's answer.

Recording starts once every node's registration was answered (how long that took is printed) and the
warm-up has passed: the steady state, not the registration storm. Printed per N: p50/p99 latency and
requests per second of each endpoint, the share of heartbeats that came late, the controller's CPU (percent
of one core, every process of it together) and resident memory (psutil), and the machine's load average at the
end of the row; then one summary table with each row's ratios against the same store's 1-worker row.

Stores: SQLite (WAL) in the controller's data dir, always with one controller process; and, where a Postgres is
given, Postgres with each ``--workers`` count (`runner server --workers N`: N controller processes on one port),
a fresh database each row. Postgres comes from ``--db URL`` (or ``RUNNER_BENCH_PG_URL``; the URL's user may create
databases), or from ``--pg-bin DIR``: a throwaway cluster started from that folder's initdb and pg_ctl, with
Postgres's durable defaults (fsync and synchronous commit on), stopped at the end.

    python benchmarks/controller_scale.py --nodes 200,1000,2000 --seconds 30                # SQLite only
    python benchmarks/controller_scale.py --nodes 2000 --workers 1,2,4 --pg-bin /usr/lib/postgresql/15/bin
    RUNNER_BENCH_PG_URL=postgresql://USER:PASS@HOST/DB python benchmarks/controller_scale.py --workers 1,2,4
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import machine, percentile  # noqa: E402

BOOTSTRAPS = "bench-bootstraps.jsonl"  # written by the controller process: one node's id and token a line
JOB = {"name": "bench", "run": "python train.py",
       "recovery": {"resume_drill": "off"}}


# --- the controller's process -------------------------------------------------------------------------
def serve_controller(data_dir: Path, db_url: str | None, workers: int) -> None:
    """`runner server` on the in-memory provider; each launch's bootstrap is appended to BOOTSTRAPS. With
    ``workers`` above 1, `runner server --workers N`'s own supervisor, each worker this script's ``--serve-worker``."""
    from runner.controller.daemon import ServerSettings
    from runner.logconfig import configure_logging

    configure_logging(data_dir / "controller.jsonl")
    settings = ServerSettings(data_dir=data_dir, port=0, db_url=db_url)
    if workers == 1:
        serve_on_memory(settings)
        return
    from runner.controller.workers import serve_workers

    sys.exit(serve_workers(settings, workers, [sys.executable, __file__, "--serve-worker"]))


def serve_worker() -> None:
    """One worker of the supervisor above: its settings on stdin, as `runner server --worker` reads them."""
    from runner.controller.workers import read_settings
    from runner.logconfig import configure_logging

    settings = read_settings(sys.stdin.buffer)
    configure_logging(settings.data_dir / "controller.jsonl", fields={"worker": settings.worker})
    serve_on_memory(settings)


def serve_on_memory(settings) -> None:
    from runner.providers.memory import MemoryProvider
    from runner.server import serve

    out = open(settings.data_dir / BOOTSTRAPS, "a", buffering=1)  # only the leader launches, so only it writes

    def hand_over(request) -> None:
        out.write(json.dumps({"node_id": request.node_id, "token": request.bootstrap.token}) + "\n")

    provider = MemoryProvider(zone_capacity=100_000, on_launch=hand_over)
    provider.describe_interval = 10.0  # as a cloud's: its API is rate-limited
    serve(settings, providers={"memory": provider})


def start_controller(data_dir: Path, db_url: str | None, workers: int) -> tuple[subprocess.Popen, str, str]:
    command = [sys.executable, __file__, "--serve", str(data_dir), "--workers", str(workers)] + (
        ["--db", db_url] if db_url else [])
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    process = subprocess.Popen(command, env={**env, "RUNNER_HOME": str(data_dir)}, stdout=subprocess.DEVNULL,
                               stderr=open(data_dir / "controller.err", "wb"), start_new_session=True)
    deadline = time.monotonic() + 300  # several workers starting on a loaded machine
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the controller exited: {(data_dir / 'controller.err').read_text()[-2000:]}")
        try:
            url = json.loads((data_dir / "controller.json").read_text())["url"]
            token = (data_dir / "admin-token").read_text().strip()
            return process, url, token
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)
    raise SystemExit("the controller did not start within 300 s")


# --- the nodes ------------------------------------------------------------------------------------------
class Recorder:
    """Each endpoint's latencies and errors over the recorded window, and the CPU figures of both processes."""

    def __init__(self):
        self.latencies: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.late = 0  # heartbeats sent more than 100 ms after their due time (the generator fell behind)
        self.beats = 0
        self.registered = 0  # nodes whose registration was answered
        self.recording = False
        self.cpu = self.gen_cpu = self.rss_mb = self.cpu_ms_per_request = self.registration_seconds = 0.0

    async def call(self, connection: "NodeConnection", method: str, path: str, endpoint: str, token: str,
                   body=None):
        started = time.perf_counter()
        try:
            status, payload = await connection.request(method, path, token, body)
            ok = status < 400
        except (OSError, ConnectionError, asyncio.TimeoutError):  # refused, reset or stalled: an error of that endpoint
            ok, payload = False, b""
            await connection.reconnect()
        elapsed = time.perf_counter() - started
        if self.recording:
            if ok:
                self.latencies[endpoint].append(elapsed)
            else:
                self.errors[endpoint] += 1
        return json.loads(payload) if ok and payload else None


class NodeConnection(asyncio.Protocol):
    """One node's keep-alive HTTP/1.1 connection to the controller: a request at a time, each reply read to its
    Content-Length (the controller always sends one)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._reply: asyncio.Future | None = None

    async def open(self) -> "NodeConnection":
        loop = asyncio.get_running_loop()
        await loop.create_connection(lambda: self, self.host, self.port)
        return self

    async def reconnect(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.transport, self._buffer = None, bytearray()
        try:
            await self.open()
        except OSError:
            pass  # the next request fails too, and tries again

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if self._reply is not None and not self._reply.done():
            self._reply.set_exception(ConnectionError("the controller closed the connection"))

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0 or self._reply is None:
            return
        head = bytes(self._buffer[:end]).decode("latin-1").lower()
        marker = head.find("content-length:")
        length = int(head[marker + 15:].split("\r\n", 1)[0]) if marker >= 0 else 0
        if len(self._buffer) < end + 4 + length:
            return
        body = bytes(self._buffer[end + 4:end + 4 + length])
        del self._buffer[:end + 4 + length]
        if not self._reply.done():  # not given up on (a reply later than the request's timeout)
            self._reply.set_result((int(head[9:12]), body))

    async def request(self, method: str, path: str, token: str, body=None, timeout: float = 60) -> tuple[int, bytes]:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionError("not connected")
        data = json.dumps(body).encode() if body is not None else b""
        self._reply = asyncio.get_running_loop().create_future()
        self.transport.write(f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {token}\r\n"
                             f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        return await asyncio.wait_for(self._reply, timeout)


async def play_node(url: str, node: dict, recorder: Recorder, stop: asyncio.Event,
                    log_every: float, checkpoint_every: float) -> None:
    token = node["token"]
    where = urlsplit(url)
    await asyncio.sleep(random.random())  # each node at its own phase within the second
    session = await NodeConnection(where.hostname, where.port).open()
    url = ""  # paths only, on the node's own connection
    while await recorder.call(session, "POST", url + "/v1/agent/register", "register", token, {"address": "10.0.0.1"}) is None:
        if stop.is_set():
            return
        await asyncio.sleep(1.0)
    recorder.registered += 1
    offset, step, beat = 0, 0, 0
    log_phase = random.randrange(int(log_every))
    checkpoint_phase = random.randrange(int(checkpoint_every))
    due = time.monotonic()
    while not stop.is_set():
        beat += 1
        step += 10
        recorder.beats += recorder.recording
        if recorder.recording and time.monotonic() - due > 0.1:
            recorder.late += 1
        await recorder.call(session, "POST", url + "/v1/agent/heartbeat", "heartbeat", token,
                            {"phase": "running", "progress": {"checkpoint_step": step - step % 100}})
        if beat % int(log_every) == log_phase:
            line = f"step {step} loss {random.random():.4f}\n".encode()
            reply = await recorder.call(session, "POST", url + "/v1/agent/logs", "logs", token,
                                        {"offset": offset, "data_b64": base64.b64encode(line).decode()})
            offset = reply["offset"] if reply else offset
        if beat % int(checkpoint_every) == checkpoint_phase:
            await recorder.call(session, "POST", url + "/v1/agent/events", "events (checkpoint)", token,
                                {"kind": "checkpoint", "data": {"step": step, "durable": True, "emergency": False,
                                                                "manifest": f"step-{step}/manifest.json",
                                                                "seconds": 0.4, "bytes": 1 << 20}})
        due = max(due + 1.0, time.monotonic())  # a late node beats again a second later, as an agent does
        await asyncio.sleep(due - time.monotonic())
    session.transport.close()


async def drive(url: str, admin: str, data_dir: Path, nodes: int, args, controller: psutil.Process) -> Recorder:
    recorder = Recorder()
    where = urlsplit(url)
    submitters = [await NodeConnection(where.hostname, where.port).open() for _ in range(16)]

    async def submit(connection: NodeConnection, numbers: range) -> None:  # through the real API: the scheduler
        for i in numbers:                                                   # launches a node for each job
            reply = await recorder.call(connection, "POST", "/v1/jobs", "submit", admin,
                                        {"spec": {**JOB, "name": f"bench-{i}"}})
            if reply is None:
                raise SystemExit(f"submitting job {i} failed; see {data_dir / 'controller.err'}")

    await asyncio.gather(*(submit(c, range(k, nodes, len(submitters))) for k, c in enumerate(submitters)))
    for connection in submitters:
        connection.transport.close()
    bootstraps = data_dir / BOOTSTRAPS
    deadline = time.monotonic() + 300
    while True:
        lines = bootstraps.read_text().splitlines() if bootstraps.exists() else []
        if len(lines) >= nodes:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(lines)} of {nodes} nodes were launched within 300 s")
        await asyncio.sleep(0.2)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(play_node(url, json.loads(line), recorder, stop, args.log_every,
                                           args.checkpoint_every)) for line in lines[:nodes]]
    started = time.monotonic()
    while recorder.registered < nodes:  # a registration storm is not the steady state measured here
        if time.monotonic() - started > 600:
            raise SystemExit(f"only {recorder.registered} of {nodes} nodes registered within 600 s")
        await asyncio.sleep(0.2)
    recorder.registration_seconds = time.monotonic() - started
    await asyncio.sleep(args.warmup)  # every node registered and at its steady cadence
    me = psutil.Process()
    processes = [controller, *controller.children(recursive=True)]  # with --workers: the parent and its workers
    before, mine, started = cpu_seconds(processes), me.cpu_times(), time.monotonic()
    recorder.recording = True
    profiler = _profile(controller.pid, args.seconds, args.profile, nodes) if args.profile else None
    await asyncio.sleep(args.seconds)
    if profiler is not None:
        profiler.wait()
    recorder.recording = False
    after, mine_after, wall = cpu_seconds(processes), me.cpu_times(), time.monotonic() - started
    used = sum(after.get(pid, seconds) - seconds for pid, seconds in before.items())  # a worker that died: lost
    recorder.cpu = 100 * used / wall
    served = sum(len(v) for v in recorder.latencies.values()) + sum(recorder.errors.values())
    recorder.cpu_ms_per_request = 1000 * used / max(1, served)
    recorder.gen_cpu = 100 * (mine_after.user + mine_after.system - mine.user - mine.system) / wall
    recorder.rss_mb = sum(_rss(p) for p in processes) / 2**20
    stop.set()
    await asyncio.gather(*tasks)
    return recorder


def cpu_seconds(processes: list[psutil.Process]) -> dict[int, float]:
    """User and system CPU seconds of each process still running, by pid."""
    seconds = {}
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        seconds[process.pid] = times.user + times.system
    return seconds


def _rss(process: psutil.Process) -> int:
    try:
        return process.memory_info().rss
    except psutil.NoSuchProcess:
        return 0


def _run(coroutine):
    """On uvloop where it is installed (as the controller runs): the generator's own CPU is less of the machine."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def _profile(pid: int, seconds: float, prefix: str, nodes: int) -> subprocess.Popen:
    """py-spy over the recorded window: the controller's stacks, every thread, as flamegraph input."""
    out = f"{prefix}.{nodes}.txt"
    return subprocess.Popen(["py-spy", "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "50", "--threads",
                             "--nonblocking", "--subprocesses",
                             "--format", "raw", "-o", out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@contextmanager
def fresh_database(db_url: str | None):
    """SQLite (None): a new file in the controller's data dir. Postgres: a new database beside the one named, made
    for this run and dropped after it; the jobs of an earlier run, whose nodes nobody plays any more, would
    otherwise be found lost and relaunched during this one."""
    if not db_url:
        yield None
        return
    import psycopg

    name = f"runner_scale_{os.getpid()}_{int(time.time() * 1000)}"
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield urlsplit(db_url)._replace(path=f"/{name}").geturl()
        finally:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@dataclass(frozen=True)
class Setup:
    store: str  # "SQLite" or "Postgres"
    workers: int  # controller processes (`runner server --workers N`)


@contextmanager
def postgres_databases(args):
    """Where the Postgres rows' databases come from: (a context giving a fresh database's URL, a line saying which
    server), or None when no Postgres was given."""
    if args.pg_bin:
        bin_dir = Path(args.pg_bin).expanduser()
        missing = [tool for tool in ("initdb", "pg_ctl") if not (bin_dir / tool).is_file()]
        if missing:
            raise SystemExit(f"--pg-bin {bin_dir}: no {' or '.join(missing)} there (Debian: /usr/lib/postgresql/N/bin)")
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from postgres_server import PostgresServer

        try:
            server = PostgresServer(bin_dir, durable=True).start()
        except KeyError:  # as root the cluster is the postgres user's (initdb refuses root), and there is none
            raise SystemExit("--pg-bin as root needs a 'postgres' system user to own the cluster; run as another "
                             "user, or start a server yourself and pass --db URL") from None

        @contextmanager
        def fresh():
            url = server.new_database()
            try:
                yield url
            finally:
                server.drop_database(url)

        try:
            yield fresh, f"a cluster of {bin_dir} on this machine, {server_version(server.url())}"
        finally:
            server.stop()
    elif args.db:
        yield (lambda: fresh_database(args.db)), f"{args.db.split('@')[-1]}, {server_version(args.db)}"
    else:
        yield None


def server_version(url: str) -> str:
    import psycopg

    with psycopg.connect(url) as conn:
        return "Postgres " + conn.execute("SHOW server_version").fetchone()[0] + (
            ", fsync " + conn.execute("SHOW fsync").fetchone()[0]
            + ", synchronous_commit " + conn.execute("SHOW synchronous_commit").fetchone()[0])


def measure(nodes: int, setup: Setup, fresh_db, args) -> dict:
    """One node count against a fresh controller: each endpoint's latency, the controller's CPU and memory."""
    with tempfile.TemporaryDirectory(prefix="controller-scale-") as folder, fresh_db() as db_url:
        data_dir = Path(folder)
        process, url, admin = start_controller(data_dir, db_url, setup.workers)
        try:
            recorder = _run(drive(url, admin, data_dir, nodes, args, psutil.Process(process.pid)))
        finally:
            process.send_signal(signal.SIGTERM)  # with workers: the parent stops them all
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
    rows = []
    for endpoint in ("heartbeat", "logs", "events (checkpoint)"):
        values = recorder.latencies.get(endpoint, [])
        rows.append({"endpoint": endpoint, "rate": len(values) / args.seconds,
                     "p50": percentile(values, 50) * 1000 if values else float("nan"),
                     "p99": percentile(values, 99) * 1000 if values else float("nan"),
                     "errors": recorder.errors.get(endpoint, 0)})
    return {"rows": rows, "cpu": recorder.cpu, "rss_mb": recorder.rss_mb, "gen_cpu": recorder.gen_cpu,
            "cpu_ms_per_request": recorder.cpu_ms_per_request,
            "late": recorder.late / max(1, recorder.beats), "registration_seconds": recorder.registration_seconds,
            "load": os.getloadavg()[0]}


def machine_load() -> str:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    one, five, fifteen = os.getloadavg()
    return f"{os.cpu_count()} cores ({usable} usable here), load average {one:.1f} / {five:.1f} / {fifteen:.1f} (1 / 5 / 15 min)"


def print_summary(results: list[tuple[int, Setup, dict]]) -> None:
    """One row per node count, store and workers; ratios against the same node count and store's 1-worker row."""
    print(f"\nsummary; {machine_load()} at the end; x: this row over the same store's 1-worker row")
    print(f"{'nodes':>6} {'store':<8} {'workers':>7} {'beats/s':>8} {'hb p50/p99 ms':>15} {'logs p99':>9} "
          f"{'ckpt p99':>9} {'errors':>6} {'CPU %':>6} {'ms/req':>7}   {'x beats/s':>9} {'x hb p99':>9} "
          f"{'x logs p99':>10} {'x ckpt p99':>10}")
    base = {(n, s.store): r for n, s, r in results if s.workers == 1}
    for nodes, setup, result in results:
        heartbeat, logs, checkpoints = result["rows"]
        one = base.get((nodes, setup.store))

        def ratio(key: str, row: int) -> str:
            if one is None:
                return "-"
            baseline = one["rows"][row][key]
            return f"{result['rows'][row][key] / baseline:.2f}" if baseline else "-"

        errors = sum(row["errors"] for row in result["rows"])
        print(f"{nodes:>6} {setup.store:<8} {setup.workers:>7} {heartbeat['rate']:>8.0f} "
              f"{heartbeat['p50']:>7.1f}/{heartbeat['p99']:<7.1f} {logs['p99']:>9.1f} {checkpoints['p99']:>9.1f} "
              f"{errors:>6} {result['cpu']:>6.0f} {result['cpu_ms_per_request']:>7.2f}   {ratio('rate', 0):>9} "
              f"{ratio('p99', 0):>9} {ratio('p99', 1):>10} {ratio('p99', 2):>10}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="200,1000,2000", help="comma-separated node counts")
    parser.add_argument("--workers", default="1,2,4", help="comma-separated controller process counts for the "
                        "Postgres rows (SQLite's row always has one; a 1-worker Postgres row is always measured, the "
                        "baseline of the ratios)")
    parser.add_argument("--stores", default="sqlite,postgres", help="which stores to measure: sqlite, postgres or "
                        "both (Postgres only where --db, RUNNER_BENCH_PG_URL or --pg-bin gives one)")
    parser.add_argument("--seconds", type=float, default=30.0, help="recorded seconds per node count")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of load before recording")
    parser.add_argument("--log-every", type=float, default=5.0, help="seconds between a node's log chunks")
    parser.add_argument("--checkpoint-every", type=float, default=30.0, help="seconds between a node's checkpoints")
    parser.add_argument("--db", default=os.environ.get("RUNNER_BENCH_PG_URL"),
                        help="a Postgres URL (default: $RUNNER_BENCH_PG_URL): each row runs on a fresh database made "
                        "beside it")
    parser.add_argument("--pg-bin", metavar="DIR", help="a folder with Postgres's initdb and pg_ctl: a throwaway "
                        "cluster started from it for this run (Postgres's durable defaults), stopped at the end")
    parser.add_argument("--profile", metavar="PREFIX", help="py-spy the controller while recording: PREFIX.N.txt "
                        "(collapsed stacks for flamegraph.pl or speedscope; pip install py-spy). py-spy takes CPU "
                        "of its own: take the figures from a run without it")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)  # internal: be the controller
    parser.add_argument("--serve-worker", action="store_true", help=argparse.SUPPRESS)  # internal: one worker of it
    args = parser.parse_args()
    if args.serve_worker:
        serve_worker()
        return
    if args.serve:
        serve_controller(args.serve, args.db, int(args.workers))  # the parent passes exactly one count
        return
    workers = sorted({1, *(int(n) for n in args.workers.split(","))})
    stores = {s.strip().lower() for s in args.stores.split(",") if s.strip()}
    if not stores <= {"sqlite", "postgres"} or not stores:
        raise SystemExit(f"--stores {args.stores}: name sqlite, postgres or both")
    # A SIGTERM (a timeout, an operator) ends this script through its cleanup: the controller it started is
    # stopped and the run's database dropped, instead of both outliving it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with postgres_databases(args) as postgres:
        if "postgres" in stores and postgres is None:
            print("no Postgres given (--db, RUNNER_BENCH_PG_URL or --pg-bin): SQLite only")
        setups = ([Setup("SQLite", 1)] if "sqlite" in stores else []) + (
            [Setup("Postgres", n) for n in workers] if "postgres" in stores and postgres is not None else [])
        if not setups:
            raise SystemExit("nothing to measure: --stores postgres needs --db, RUNNER_BENCH_PG_URL or --pg-bin")
        print(machine())
        print(f"{machine_load()} at the start (other work on this machine takes CPU from both sides)")
        print(f"stores: {', '.join(f'{s.store} with {s.workers} controller process(es)' for s in setups)}"
              + (f"; Postgres: {postgres[1]}" if postgres else ""))
        print(f"heartbeat 1 Hz, a log chunk every {args.log_every:g} s, a checkpoint every {args.checkpoint_every:g} s "
              f"per node; {args.seconds:g} s recorded after {args.warmup:g} s of warm-up")
        print(f"{'nodes':>6} {'store':<8} {'workers':>7} {'endpoint':<20} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'errors':>6}   controller")
        results = []
        for count in [int(n) for n in args.nodes.split(",")]:
            for setup in setups:
                fresh_db = (lambda: fresh_database(None)) if setup.store == "SQLite" else postgres[0]
                result = measure(count, setup, fresh_db, args)
                results.append((count, setup, result))
                first = True
                for row in result["rows"]:
                    extra = (f"{result['cpu']:.0f}% CPU ({result['cpu_ms_per_request']:.2f} ms a request), "
                             f"{result['rss_mb']:.0f} MB RSS; generator {result['gen_cpu']:.0f}% CPU, "
                             f"{result['late']:.1%} of heartbeats late; all registered in "
                             f"{result['registration_seconds']:.0f} s; load average {result['load']:.1f}") if first else ""
                    print(f"{count:>6} {setup.store:<8} {setup.workers:>7} {row['endpoint']:<20} {row['rate']:>7.0f} "
                          f"{row['p50']:>8.1f} {row['p99']:>8.1f} {row['errors']:>6}   {extra}", flush=True)
                    first = False
        print_summary(results)


if __name__ == "__main__":
    main()
