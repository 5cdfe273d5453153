"""Fixtures of the checkpoint tests: a tiny training setup, the trainee program, a tmpfs, moto's S3 server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from runner.checkpoint import Checkpointer, ResumableSampler

TRAINEE = Path(__file__).with_name("trainee.py")
RUNNER_VARS = ("RUNNER_CHECKPOINT_DIR", "RUNNER_CHECKPOINT_URL", "RUNNER_CONTROL", "RUNNER_ATTEMPT",
               "RUNNER_JOB_ID", "RUNNER_MTBF_SECONDS", "RUNNER_SIGNAL_GRACE_SECONDS")


@pytest.fixture(autouse=True)
def _no_runner_env(monkeypatch):
    """Tests start outside the runner: none of its variables are set unless a test sets them."""
    for name in RUNNER_VARS:
        monkeypatch.delenv(name, raising=False)


class Setup:
    """A model, an optimizer, a scheduler and a sampler, with helpers to train and compare them."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.05)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=3, gamma=0.5)
        self.sampler = ResumableSampler(40, shuffle=True, seed=1)

    def objects(self) -> dict:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler,
                "sampler": self.sampler}

    def train(self, steps: int = 1) -> None:
        for _ in range(steps):
            loss = self.model(torch.randn(3, 4)).square().mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()

    def weights(self) -> list[torch.Tensor]:
        return [t.clone() for t in self.model.state_dict().values()]

    def checkpointer(self, local_dir, **options) -> Checkpointer:
        return Checkpointer(local_dir=local_dir, **options, **self.objects())


@pytest.fixture
def setup() -> Setup:
    return Setup()


@pytest.fixture
def make_setup():
    return Setup


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def start_trainee(*args: str, cwd: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in RUNNER_VARS}
    env["PYTHONHASHSEED"] = "0"
    return subprocess.Popen([sys.executable, str(TRAINEE), *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def run_trainee(*args: str, cwd: Path, timeout: float = 300) -> list[str]:
    """Run the trainee to its end and return its own result lines (ready/final/stopped).

    The timeout only catches a hung trainee: a start that imports torch and a cloud SDK took over 60 s at load 20."""
    proc = start_trainee(*args, cwd=cwd)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return [line for line in out.splitlines() if line.split(" ", 1)[0] in ("ready", "final", "stopped")]


@pytest.fixture(scope="session")
def reference_hashes(tmp_path_factory) -> dict:
    """Per-step state hashes of one uninterrupted 60-step trainee run (``"final"`` maps to its final line).

    A process of its own, as the interrupted runs are: run in the test process, any thread a test left behind
    that draws from a global generator (a library's retry jitter) moves the reference's stream mid-run."""
    work = tmp_path_factory.mktemp("reference")
    ready, final = run_trainee("--steps", "60", "--local-dir", str(work / "ckpt"), "--hash-log", str(work / "log"),
                               cwd=work)
    hashes = {int(s): h for s, h in (line.split() for line in (work / "log").read_text().splitlines())}
    hashes["final"] = final
    assert ready.split()[1] == "0" and final.startswith("final") and len(hashes) == 62
    return hashes


def read_ready(proc: subprocess.Popen) -> tuple[int, str]:
    """Wait for the trainee's ``ready <step> <sha>`` line (log lines may come first)."""
    for line in proc.stdout:
        if line.startswith("ready "):
            _, step, sha = line.split()
            return int(step), sha
    raise AssertionError(f"the trainee exited before it was ready: {proc.stderr.read()[-2000:]}")


@pytest.fixture
def tmpfs(tmp_path):
    """A 2 MiB tmpfs (mounting needs root; the test is skipped where that is not possible)."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture(scope="session")
def s3_endpoint():
    """moto's S3 server on loopback, with fake credentials in the environment."""
    pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_env(s3_endpoint, monkeypatch):
    """The S3 variables pointing at moto. s3fs caches its filesystems by constructor arguments, not by the
    endpoint in the environment, so the cache is emptied around each test that changes the endpoint."""
    import s3fs

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    s3fs.S3FileSystem.clear_instance_cache()
    yield s3_endpoint
    s3fs.S3FileSystem.clear_instance_cache()


def kill(proc: subprocess.Popen, signum=signal.SIGKILL) -> None:
    if proc.poll() is None:
        proc.send_signal(signum)
