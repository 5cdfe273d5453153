"""Job files a careless or hostile user writes: each is refused at validate (exit 2), naming the file or key and the fix."""

from __future__ import annotations

from pathlib import Path

from fsspec.registry import known_implementations
import pytest

from runner.spec import SpecError, load_job_file, parse_job

GOOD = "name: ok\nrun: python train.py\n"


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_job(text, "job.yaml")
    return caught.value.problems


def test_validate_on_a_binary_file_exits_2_saying_it_is_not_a_text_yaml_file(tmp_path: Path, runner):
    """A binary file given as the job file is named as not a text YAML file, exit 2, no traceback."""
    path = tmp_path / "model.bin"
    path.write_bytes(bytes(range(256)) * 4)
    result = runner("validate", str(path))
    assert result.returncode == 2, result.stderr
    assert f"{path}: not a text YAML file" in result.stderr and "Traceback" not in result.stderr


def test_a_job_file_with_a_nul_byte_is_not_a_text_yaml_file(tmp_path: Path):
    """UTF-8 with a NUL byte in it is binary too, and said so."""
    path = tmp_path / "job.yaml"
    path.write_bytes(GOOD.encode() + b"\0\1\2")
    with pytest.raises(SpecError, match="not a text YAML file"):
        load_job_file(path)


def test_a_durable_url_with_an_unknown_scheme_names_the_key_and_the_known_schemes():
    """nosuchscheme:// is refused, naming checkpoint.durable_url, the schemes fsspec knows and the bucket extras."""
    (problem,) = _problems(GOOD + "checkpoint: {durable_url: 'nosuchscheme://x/y'}")
    assert problem.startswith("checkpoint.durable_url:") and "nosuchscheme://" in problem
    assert "s3, s3a" in problem and "file" in problem
    assert "runner[s3]" in problem and "runner[gcs]" in problem


def test_a_durable_url_whose_filesystem_is_not_installed_names_what_to_install(monkeypatch):
    """A scheme fsspec knows but cannot import here is refused with the package to install."""
    monkeypatch.setitem(known_implementations, "nofs",
                        {"class": "runner_no_such_module.NoFileSystem", "err": "pip install nofs"})
    (problem,) = _problems(GOOD + "checkpoint: {durable_url: 'nofs://bucket/x'}")
    assert problem.startswith("checkpoint.durable_url:") and "pip install nofs" in problem


@pytest.mark.parametrize("url", ["s3://bucket/job", "gs://bucket/job", "file:///tmp/ckpt", "/mnt/nvme/ckpt",
                                 "memory://ckpt"])
def test_durable_urls_that_fsspec_can_open_are_accepted(url):
    """Buckets, file:// URLs and plain paths pass."""
    assert parse_job(GOOD + f"checkpoint: {{durable_url: '{url}'}}").checkpoint.durable_url == url
