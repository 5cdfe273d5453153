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


def test_a_run_command_over_128_kib_is_refused_naming_run():
    """A run: too long to be one argument of bash -c (E2BIG on the node) is refused at validate."""
    (problem,) = _problems("name: ok\nrun: \"echo " + "x" * (128 * 1024) + "\"\n")
    assert problem.startswith("run:") and "128 KiB" in problem and "script" in problem


def test_a_nul_byte_in_an_env_value_is_refused_naming_the_variable():
    """An env value with a NUL byte, which no process environment can carry, is refused naming env and the key."""
    (problem,) = _problems(GOOD + 'env: {TOKEN: "abc\\0def"}\n')
    assert problem.startswith("env:") and "TOKEN" in problem and "NUL" in problem


@pytest.mark.parametrize("env", ["[API_KEY=sk-live-4242]", "API_KEY=sk-live-4242", "[{API_KEY: sk-live-4242}]"])
def test_an_env_that_is_not_a_mapping_is_refused_without_showing_its_values(env):
    """env: written as a list or a string (the form of other tools) is refused naming env and the form it takes,
    and the message never repeats the values: they are the job's secrets."""
    (problem,) = _problems(GOOD + f"env: {env}\n")
    assert problem.startswith("env: must be a mapping of NAME: value") and "sk-live-4242" not in problem


@pytest.mark.parametrize("env", ["{API_KEY=sk-live-4242}", "{API_KEY = sk-live-4242}", "\n  API_KEY=sk-live-4242: x"])
def test_a_name_equals_value_in_env_is_refused_naming_the_variable_without_its_value(env):
    """{API_KEY=...} (the shell's form) is a mapping whose key holds the value: refused naming the variable and the
    form to use, never showing the value."""
    (problem,) = _problems(GOOD + f"env: {env}\n")
    assert problem.startswith("env: 'API_KEY': write NAME: value") and "sk-live-4242" not in problem


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_an_interval_that_is_not_a_finite_duration_is_refused(value):
    """interval: inf (which the controller could not even serialise) is refused naming checkpoint.interval."""
    problems = _problems(GOOD + f"checkpoint: {{interval: {value}}}\n")
    assert problems and all(p.startswith("checkpoint.interval:") for p in problems), problems


def test_a_submitted_interval_of_1e400_is_refused():
    """JSON's 1e400 (inf once parsed) reaching the controller's validation is refused, not stored."""
    import json

    from runner.spec import validate_job

    with pytest.raises(SpecError, match="checkpoint.interval"):
        validate_job(json.loads('{"name": "ok", "run": "x", "checkpoint": {"interval": 1e400}}'))


def test_a_workdir_with_an_absolute_symlink_is_refused_naming_the_link(tmp_path: Path):
    """A link to an absolute path, which no node can unpack, is refused at validate naming workdir and the link."""
    (tmp_path / "data").symlink_to("/etc/hostname")
    (tmp_path / "job.yaml").write_text(GOOD)
    with pytest.raises(SpecError) as caught:
        load_job_file(tmp_path / "job.yaml")
    (problem,) = caught.value.problems
    assert problem.startswith("workdir: data is a symbolic link to /etc/hostname")


def test_a_relative_symlink_that_leaves_the_workdir_is_refused(tmp_path: Path):
    """../ out of the workdir is refused like an absolute link; a link inside the workdir is fine."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print(1)\n")
    (tmp_path / "code" / "main.py").symlink_to("train.py")
    (tmp_path / "code" / "secrets").symlink_to("../outside")
    (tmp_path / "code" / "job.yaml").write_text(GOOD)
    with pytest.raises(SpecError) as caught:
        load_job_file(tmp_path / "code" / "job.yaml")
    assert [p.split(" is ")[0] for p in caught.value.problems] == ["workdir: secrets"]


@pytest.mark.parametrize("recovery, key, words", [
    ('{deadline: "0001-01-01T00:00:00+14:00", total_steps: 100}', "recovery.deadline", "years 2000 to 9999"),
    ('{deadline: "99999999999999999999d", total_steps: 100}', "recovery.deadline", "longest duration"),
    ('{deadline: "\uff13\uff16h", total_steps: 100}', "recovery.deadline", "ASCII digits"),
    ('{resume_drill: "\uff11m"}', "recovery.resume_drill", "ASCII digits"),
    ('{deadline: 36h, total_steps: 9223372036854775808}', "recovery.total_steps", "less than 9007199254740992"),
])
def test_recovery_values_that_make_no_sense_exit_2_naming_the_key(tmp_path: Path, runner, recovery, key, words):
    """`runner validate` on a deadline before the year 1 in UTC (once exit 1), a duration of twenty digits,
    full-width digits, or 2**63 steps: exit 2, the key and why named."""
    path = tmp_path / "job.yaml"
    path.write_text(GOOD + f"recovery: {recovery}\n", encoding="utf-8")
    result = runner("validate", str(path))
    assert result.returncode == 2, result.stderr
    assert key in result.stderr and words in result.stderr and "Traceback" not in result.stderr


def test_a_duration_takes_ascii_digits_within_ten_years():
    """parse_duration, behind every duration of a job file and the checkpoint library."""
    from runner.durations import parse_duration

    assert parse_duration("3650d") == 3650 * 86400 and parse_duration("1h30m") == 5400
    for text in ("\uff13\uff16h", "\uff11\uff12", "3651d", "99999999999999999999d", 10**20):
        with pytest.raises(ValueError):
            parse_duration(text)
