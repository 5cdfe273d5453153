"""A workdir over the size limit is refused as bad input (exit 2) while it is packed, never held in memory."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from runner.cli import workdir
from runner.cli.main import main

LIMIT = 2 << 20
DATA = 12 << 20  # random bytes do not compress: the packed workdir passes the limit


@pytest.fixture
def big_job(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setattr(workdir, "MAX_BYTES", LIMIT)
    monkeypatch.setenv("RUNNER_SERVER", "http://127.0.0.1:9")  # never reached: the workdir is refused first
    monkeypatch.setenv("RUNNER_TOKEN", "x")
    (tmp_path / "data.bin").write_bytes(os.urandom(DATA))
    (tmp_path / "job.yaml").write_text("name: big\nrun: python train.py\n")
    return tmp_path / "job.yaml"


def test_submit_of_a_workdir_over_the_limit_exits_2_naming_workdir(big_job, capsys):
    """Over the limit is bad input: exit 2, and the message names workdir and the limit."""
    assert main(["submit", str(big_job)]) == 2
    err = capsys.readouterr().err
    assert "workdir: packs to more than 2 MiB" in err and "Traceback" not in err


def test_a_workdir_over_the_limit_is_never_packed_in_memory(big_job):
    """Packing streams to a temporary file and stops at the limit: memory stays far below the workdir's size."""
    tracemalloc.start()
    try:
        with pytest.raises(workdir.WorkdirTooLarge):
            workdir.pack_workdir(big_job.parent)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < LIMIT
