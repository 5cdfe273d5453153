"""The job's workdir archive is unpacked on the node with no member escaping the workdir."""

from __future__ import annotations

import io
import stat
import tarfile

import pytest

from agents.workdir_archive import extract_safely


def _archive(members: dict[str, bytes], mode: int = 0o644) -> tarfile.TarFile:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return tarfile.open(fileobj=buffer, mode="r:gz")


def test_plain_files_are_unpacked_into_the_workdir(tmp_path):
    """train.py and a nested data file land inside the workdir."""
    with _archive({"train.py": b"print(1)\n", "data/x.txt": b"x"}) as tar:
        extract_safely(tar, tmp_path)
    assert (tmp_path / "train.py").read_bytes() == b"print(1)\n" and (tmp_path / "data" / "x.txt").exists()


def test_a_member_climbing_out_of_the_workdir_is_refused(tmp_path):
    """A '../' member is an error, and nothing is written outside the workdir."""
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    with _archive({"../escaped.txt": b"no"}) as tar, pytest.raises(tarfile.TarError):
        extract_safely(tar, workdir)
    assert not (tmp_path / "escaped.txt").exists()


def test_unpacked_files_are_private_to_the_nodes_user_whatever_the_archive_says(tmp_path):
    """Files packed readable by all (0644, 0755) are unpacked readable by their owner only: a job's code may
    hold secrets. The owner keeps the execute bit."""
    for mode, expected in ((0o644, 0o600), (0o755, 0o700)):
        into = tmp_path / oct(mode)
        into.mkdir()
        with _archive({"job.yaml": b"env: {API_KEY: x}\n"}, mode=mode) as tar:
            extract_safely(tar, into)
        assert stat.S_IMODE((into / "job.yaml").stat().st_mode) == expected
