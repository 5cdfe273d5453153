"""Detection latency: from a notice appearing on the metadata server to the loop's callback.

For each protocol, against its fake metadata server on loopback:

* the watcher as shipped (default timing): AWS polls instance-action every 0.5 s, GCP waits in
  hanging GETs, Azure polls every 1 s;
* a baseline measured in the same run: a plain poll of the same notice every 2 s (what
  aws-node-termination-handler does), written here independently of our watchers.

The notice is injected at a random phase relative to the polls, so the latencies sample what a real
notice would see. The request rate is measured separately on an idle node (no notice) for
``--rate-seconds``, counting every request the fake receives. All series run concurrently, each on
its own fake server.

    python benchmarks/detection.py --count 100
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import threading
import time
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import percentile  # noqa: E402

from agents.watchers import AWSWatcher, AzureWatcher, WatchLoop, gcp_watchers  # noqa: E402
from agents.watchers.base import http_session  # noqa: E402
from runner.providers.local.metadata import FakeGCEMetadata, FakeIMDS, FakeScheduledEvents  # noqa: E402

SERVERS = {"aws": FakeIMDS, "gcp": FakeGCEMetadata, "azure": FakeScheduledEvents}
PHASE = {"aws": 0.5, "gcp": 0.5, "azure": 1.0}  # spread of the injection moment (one poll period)
SETTLE = 0.3  # let a fresh loop finish its first checks before the random phase starts
LABEL = {"aws": "watcher, 0.5 s poll", "gcp": "watcher, hanging GET", "azure": "watcher, 1 s poll"}


def watchers(cloud: str, endpoint: str) -> list:
    if cloud == "aws":
        return [AWSWatcher(endpoint)]
    if cloud == "gcp":
        return gcp_watchers(endpoint)
    return [AzureWatcher(endpoint)]


class PlainPoll:
    """The baseline: one GET of the notice every ``interval`` seconds, nothing else."""

    def __init__(self, cloud: str, server, interval: float):
        self.cloud, self.server, self.interval = cloud, server, interval
        self.session = http_session()
        self.token = None
        if cloud == "aws":
            self.token = self.session.put(server.url + "/latest/api/token", timeout=2,
                                          headers={"X-aws-ec2-metadata-token-ttl-seconds": "21600"}).text

    def notice_present(self) -> bool:
        try:
            if self.cloud == "aws":
                r = self.session.get(self.server.url + "/latest/meta-data/spot/instance-action", timeout=2,
                                     headers={"X-aws-ec2-metadata-token": self.token})
                return r.status_code == 200
            if self.cloud == "gcp":
                r = self.session.get(f"http://{self.server.endpoint}/computeMetadata/v1/instance/preempted",
                                     headers={"Metadata-Flavor": "Google"}, timeout=2)
                return r.text == "TRUE"
            r = self.session.get(self.server.url + "/metadata/scheduledevents", timeout=2,
                                 params={"api-version": "2020-07-01"}, headers={"Metadata": "true"})
            return any(e["EventType"] == "Preempt" for e in r.json()["Events"])
        except Exception:  # noqa: BLE001 - a failed poll is just no notice for the baseline
            return False

    def run(self, first_at: float, stop: threading.Event, found: list) -> None:
        tick = first_at
        while not stop.wait(max(0.0, tick - time.monotonic())):
            if self.notice_present():
                found.append(time.monotonic())
                return
            tick += self.interval


def measure_watcher(cloud: str, count: int, rng: random.Random, out: list) -> None:
    server = SERVERS[cloud]().start()
    try:
        for _ in range(count):
            server.reset()
            seen, found = threading.Event(), []

            def on_notice(notice, found=found, seen=seen):
                if notice.terminal:
                    found.append(time.monotonic())
                    seen.set()

            loop = WatchLoop(watchers(cloud, server.endpoint), on_notice).start()
            time.sleep(SETTLE + rng.uniform(0, PHASE[cloud]))
            injected = time.monotonic()
            server.preempt(120)
            if seen.wait(10):
                out.append(found[0] - injected)
            loop.stop(timeout=0.1)
    finally:
        server.stop()


def measure_baseline(cloud: str, count: int, interval: float, rng: random.Random, out: list) -> None:
    server = SERVERS[cloud]().start()
    try:
        for _ in range(count):
            server.reset()
            poller = PlainPoll(cloud, server, interval)
            stop, found = threading.Event(), []
            start = time.monotonic()
            injected = start + 0.05
            thread = threading.Thread(target=poller.run, args=(injected + rng.uniform(0, interval), stop, found))
            thread.start()
            time.sleep(max(0.0, injected - time.monotonic()))
            injected = time.monotonic()
            server.preempt(120)
            thread.join(interval + 5)
            stop.set()
            if found:
                out.append(found[0] - injected)
    finally:
        server.stop()


def measure_rate(cloud: str, seconds: float, interval: float | None, out: dict) -> None:
    """Requests per second to an idle node's server: the watcher (interval None) or the baseline."""
    server = SERVERS[cloud]().start()
    notices: list = []
    try:
        if interval is None:
            loop = WatchLoop(watchers(cloud, server.endpoint), notices.append).start()
            time.sleep(seconds)
            loop.stop(timeout=0.1)
        else:
            stop = threading.Event()
            poller = PlainPoll(cloud, server, interval)
            thread = threading.Thread(target=poller.run, args=(time.monotonic(), stop, []))
            thread.start()
            time.sleep(seconds)
            stop.set()
            thread.join()
        out["rate"] = server.requests / seconds
        out["false_alarms"] = len(notices)
    finally:
        server.stop()




def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100, help="notices per protocol and series (default 100)")
    parser.add_argument("--protocols", default="aws,gcp,azure")
    parser.add_argument("--baseline-interval", type=float, default=2.0)
    parser.add_argument("--rate-seconds", type=float, default=60.0, help="idle window for the request rate")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    clouds = [c.strip() for c in args.protocols.split(",") if c.strip()]

    results: dict[tuple[str, str], dict] = {}
    threads = []
    for index, cloud in enumerate(clouds):
        for series in ("watcher", "baseline"):
            entry = results[(cloud, series)] = {"latencies": [], "rate": {}}
            rng = random.Random(args.seed * 100 + index * 2 + (series == "baseline"))
            if series == "watcher":
                jobs = [(measure_watcher, (cloud, args.count, rng, entry["latencies"])),
                        (measure_rate, (cloud, args.rate_seconds, None, entry["rate"]))]
            else:
                jobs = [(measure_baseline, (cloud, args.count, args.baseline_interval, rng, entry["latencies"])),
                        (measure_rate, (cloud, args.rate_seconds, args.baseline_interval, entry["rate"]))]
            threads += [threading.Thread(target=fn, args=fargs, daemon=True) for fn, fargs in jobs]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    print(f"\nDetection latency, notice injected -> callback; {args.count} notices per series; "
          f"request rate on an idle node over {args.rate_seconds:g} s ({time.monotonic() - started:.0f} s run)\n")
    header = (f"{'protocol':<8} {'series':<24} {'n':>4} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
              f"{'req/s':>6} {'false':>5}  {'p50 x':>6} {'p99 x':>6} {'req/s x':>7}")
    print(header)
    print("-" * len(header))
    for cloud in clouds:
        base = results[(cloud, "baseline")]
        for series in ("watcher", "baseline"):
            entry = results[(cloud, series)]
            lat = entry["latencies"]
            if not lat:
                print(f"{cloud:<8} {series:<24} no notice detected")
                continue
            p50, p99, worst = percentile(lat, 50), percentile(lat, 99), max(lat)
            name = LABEL[cloud] if series == "watcher" else f"plain {args.baseline_interval:g} s poll"
            line = (f"{cloud:<8} {name:<24} {len(lat):>4} {p50 * 1e3:>8.1f} {p99 * 1e3:>8.1f} {worst * 1e3:>8.1f} "
                    f"{entry['rate'].get('rate', float('nan')):>6.2f} {entry['rate'].get('false_alarms', 0):>5}")
            if series == "watcher" and base["latencies"]:
                line += (f"  {percentile(base['latencies'], 50) / p50:>6.1f} "
                         f"{percentile(base['latencies'], 99) / p99:>6.1f} "
                         f"{entry['rate']['rate'] / base['rate']['rate']:>7.2f}")
            print(line)
    print("\np50 x, p99 x: baseline latency / watcher latency (higher is better); "
          "req/s x: watcher request rate / baseline request rate.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
