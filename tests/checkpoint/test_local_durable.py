"""local-durable://, the local market's durable tier: the local filesystem, held to a node's bandwidth.

The bounds asserted are lower bounds (N MB at R MB/s take no less than N / R seconds), true however fast or
busy the machine is."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from runner.checkpoint import Checkpointer
from runner.local_durable import BUCKET_VARIABLE, RATE_VARIABLE, throttle_environment

RATE_MB_PER_S = 4.0
MB = 1e6


@pytest.fixture(autouse=True)
def _unthrottled(monkeypatch):
    monkeypatch.delenv(RATE_VARIABLE, raising=False)
    monkeypatch.delenv(BUCKET_VARIABLE, raising=False)


@pytest.fixture
def throttled(monkeypatch, tmp_path):
    """This process is a node with RATE_MB_PER_S of durable bandwidth per direction."""
    for key, value in throttle_environment(RATE_MB_PER_S, tmp_path / "bucket").items():
        monkeypatch.setenv(key, value)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(1000, 1500)  # 1.5 M float32 weights: about 6 MB


def _durable_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def test_without_a_bandwidth_the_url_is_the_local_filesystem(tmp_path):
    """Outside a throttled node (the controller, a user's shell) local-durable:// is a plain folder."""
    model = _model()
    url = "local-durable://" + str(tmp_path / "durable")
    with Checkpointer(local_dir=tmp_path / "a", durable_url=url, model=model) as ckpt:
        ckpt.save(3)
        assert ckpt.wait()
    assert (tmp_path / "durable").is_dir()
    fresh = nn.Linear(1000, 1500)
    with Checkpointer(local_dir=tmp_path / "b", durable_url=url, model=fresh) as ckpt:
        assert ckpt.restore() == 3
    assert torch.equal(fresh.weight, model.weight)


def test_an_upload_and_a_restore_each_take_at_least_their_size_over_the_bandwidth(throttled, tmp_path):
    """A checkpoint's upload, then a new node's restore (its local tier empty), each move N MB in >= N/rate s."""
    durable = tmp_path / "durable"
    url = "local-durable://" + str(durable)
    model = _model()
    with Checkpointer(local_dir=tmp_path / "node-1", durable_url=url, model=model) as ckpt:
        started = time.monotonic()
        ckpt.save(7)
        assert ckpt.wait()
        upload_seconds = time.monotonic() - started
    size = _durable_bytes(durable)
    assert size > 5 * MB
    assert upload_seconds >= size / (RATE_MB_PER_S * MB)

    fresh = nn.Linear(1000, 1500)
    with Checkpointer(local_dir=tmp_path / "node-2", durable_url=url, model=fresh) as ckpt:
        started = time.monotonic()
        assert ckpt.restore() == 7
        restore_seconds = time.monotonic() - started
    assert torch.equal(fresh.weight, model.weight)
    assert restore_seconds >= size / (RATE_MB_PER_S * MB)


def test_the_processes_of_one_node_share_its_bandwidth(throttled, tmp_path):
    """Two processes of one node uploading 3 MB each at once take at least 6 MB over the node's rate."""
    source = tmp_path / "blob"
    source.write_bytes(b"x" * int(3 * MB))
    upload = textwrap.dedent(f"""
        import sys, fsspec
        import runner.local_durable
        fs, root = fsspec.core.url_to_fs("local-durable://{tmp_path}/durable")
        fs.makedirs(root, exist_ok=True)
        fs.put_file("{source}", root + "/" + sys.argv[1])
    """)
    started = time.monotonic()
    uploads = [subprocess.Popen([sys.executable, "-c", upload, name]) for name in ("a", "b")]
    assert [p.wait(timeout=120) for p in uploads] == [0, 0]
    assert time.monotonic() - started >= 6 * MB / (RATE_MB_PER_S * MB)
    assert (tmp_path / "durable" / "a").read_bytes() == source.read_bytes() == (tmp_path / "durable" / "b").read_bytes()


def test_a_file_is_visible_under_its_name_only_once_complete(tmp_path):
    """Like an object store: a reader following an upload (agents/prefetch.py) never sees half a file; and
    under a bandwidth one upload moves one file at a time, so files complete one after another."""
    from runner.local_durable import LocalDurableFileSystem, is_partial

    fs = LocalDurableFileSystem(mb_per_s=50)
    target = tmp_path / "step-00000001" / "data-00000.bin"
    target.parent.mkdir()
    with fs.open(f"local-durable://{target}", "wb") as sink:
        sink.write(b"x" * 1_000_000)
        assert not target.exists() and all(is_partial(p.name) for p in target.parent.iterdir())
    assert target.read_bytes() == b"x" * 1_000_000 and [p.name for p in target.parent.iterdir()] == [target.name]
    source = tmp_path / "local.bin"
    source.write_bytes(b"y" * 100)
    fs.put_file(str(source), f"local-durable://{tmp_path / 'step-00000001' / 'skeleton.pkl'}")
    assert sorted(p.name for p in target.parent.iterdir()) == ["data-00000.bin", "skeleton.pkl"]
    assert fs.upload_streams == 1 and LocalDurableFileSystem().upload_streams is None


class _Clock:
    """A clock that moves only when told: every sleep oversleeps by 2 ms and every write takes 3 ms, as on a
    busy machine; the bandwidth's arithmetic is checked against it, not against this machine's speed."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds + 0.002


class _SlowSink:
    def __init__(self, clock: _Clock):
        self.clock = clock
        self.written = 0

    def write(self, chunk: bytes) -> None:
        self.clock.now += 0.003
        self.written += len(chunk)


@pytest.mark.parametrize("megabytes", [1, 64])
def test_a_transfer_makes_up_the_time_lost_between_its_chunks_but_never_beats_the_bandwidth(monkeypatch, megabytes):
    """200 MB/s: 1 MiB costs 5.2 ms of budget. Losing 5 ms a chunk (oversleep + write) for good moved 64 MiB at
    101 MB/s; made up, it moves at the bandwidth, and no faster (at least N / rate from the first chunk)."""
    import io

    from runner import local_durable

    clock = _Clock()
    monkeypatch.setattr(local_durable, "time", clock)
    bandwidth = local_durable.Bandwidth(200e6, "up", None)
    monkeypatch.setattr(local_durable.Bandwidth, "_local_next", {})
    size = megabytes << 20
    sink = _SlowSink(clock)
    started = clock.now
    local_durable._copy(io.BytesIO(bytes(size)), sink, bandwidth)  # noqa: SLF001
    seconds = clock.now - started
    assert sink.written == size
    assert seconds >= size / 200e6  # never faster than the bandwidth
    assert seconds <= size / 200e6 + 0.010  # the lost time made up, but for the last chunk's write and oversleep


def test_a_file_written_through_the_filesystem_makes_up_lost_time_too(monkeypatch, tmp_path):
    """An upload written chunk by chunk through the store's file object (an emergency checkpoint uploaded from
    its staged buffer) is held to the bandwidth as a copied file is: never faster, and not slower by what each
    chunk's oversleep and write lost (an emergency upload took 10.2 s where a periodic one of the same 1 GB
    took 6.0)."""
    from runner import local_durable

    clock = _Clock()
    monkeypatch.setattr(local_durable, "time", clock)
    monkeypatch.setattr(local_durable.Bandwidth, "_local_next", {})
    fs = local_durable.LocalDurableFileSystem(mb_per_s=200, skip_instance_cache=True)
    size, chunk = 64 << 20, 1 << 20
    started = clock.now
    with fs.open(str(tmp_path / "data.bin"), "wb") as sink:
        for _ in range(size // chunk):
            sink.write(bytes(chunk))
            clock.now += 0.003  # the write, and the checksum beside it
    seconds = clock.now - started
    assert (tmp_path / "data.bin").stat().st_size == size
    assert size / 200e6 <= seconds <= size / 200e6 + 0.010
