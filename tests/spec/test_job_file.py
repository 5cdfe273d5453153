"""The job file: every mistake is exit 2 with the key named; good files load with defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.spec import SpecError, load_job_file, parse_job
from runner.spec.jsonschema import job_json_schema

GOOD = "name: tiny-gpt\nrun: python train.py\n"

BAD = [
    ("name: Tiny_GPT\nrun: x", "name"),
    ("name: " + "a" * 64 + "\nrun: x", "name"),
    ("name: ok", "run"),
    ("name: ok\nrun: x\nresume: yes", "resume"),
    ("name: ok\nrun: x\nresources: {accelerators: T4-1}", "resources.accelerators"),
    ("name: ok\nrun: x\nresources: {accelerators: 'T4:0'}", "resources.accelerators"),
    ("name: ok\nrun: x\nresources: {accelerators: [T4:1, T4-1]}", "resources.accelerators[1]"),
    ("name: ok\nrun: x\nresources: {accelerators: [T4:1, A100:1, t4:1]}", "resources.accelerators[2]"),
    ("name: ok\nrun: x\nresources: {accelerators: [T4:1, X100:1]}", "resources.accelerators[1]"),
    ("name: ok\nrun: x\nresources: {accelerators: X100:1}", "resources.accelerators"),
    ("name: ok\nrun: x\nresources: {accelerators: []}", "resources.accelerators"),
    ("name: ok\nrun: x\nresources: {cloud: [azurre]}", "resources.cloud"),
    ("name: ok\nrun: x\nresources: {spot_policy: cheap}", "resources.spot_policy"),
    ("name: ok\nrun: x\nresources: {max_price_per_hour: -1}", "resources.max_price_per_hour"),
    ("name: ok\nrun: x\nresources: {cpus: many}", "resources.cpus"),
    ("name: ok\nrun: x\nresources: {num_nodes: 3, min_nodes: 4}", "resources.min_nodes"),
    ("name: ok\nrun: x\nresources: {min_nodes: 2}", "resources.min_nodes"),
    ("name: ok\nrun: x\nresources: {num_nodes: 3, min_nodes: 0}", "resources.min_nodes"),
    ("name: ok\nrun: x\nresources: {num_nodes: 3, min_nodes: '2'}", "resources.min_nodes"),
    ("name: ok\nrun: x\nresources: {num_nodes: 3, min_nodes: 1.5}", "resources.min_nodes"),
    ("name: ok\nrun: x\ncheckpoint: {keep: 0}", "checkpoint.keep"),
    ("name: ok\nrun: x\ncheckpoint: {interval: 5 minutes}", "checkpoint.interval"),
    ("name: ok\nrun: x\ncheckpoint: {intervall: 5m}", "checkpoint.intervall"),
    ("name: ok\nrun: x\nrecovery: {resume_drill: 20m}", "recovery.resume_drill"),
    ("name: ok\nrun: x\nrecovery: {max_failures: -1}", "recovery.max_failures"),
    ("name: ok\nrun: x\nenv: {1BAD: x}", "env"),
    # wrong types that would otherwise pass as numbers (true as 1, '5' as 5), and an impossible drill time
    ("name: ok\nrun: x\ncheckpoint: {keep: true}", "checkpoint.keep"),
    ("name: ok\nrun: x\ncheckpoint: {keep: '5'}", "checkpoint.keep"),
    ("name: ok\nrun: x\ncheckpoint: {interval: true}", "checkpoint.interval"),
    ("name: ok\nrun: x\nresources: {cpus: true}", "resources.cpus"),
    ("name: ok\nrun: x\nresources: {memory_gb: '16'}", "resources.memory_gb"),
    ("name: ok\nrun: x\nresources: {max_price_per_hour: true}", "resources.max_price_per_hour"),
    ("name: ok\nrun: x\nresources: {cloud: []}", "resources.cloud"),
    ("name: ok\nrun: x\nrecovery: {max_preemptions: false}", "recovery.max_preemptions"),
    ("name: ok\nrun: x\nrecovery: {max_failures: true}", "recovery.max_failures"),
    ("name: ok\nrun: x\nrecovery: {resume_drill: 0}", "recovery.resume_drill"),
    ("name: ok\nrun: x\nrecovery: {resume_drill: true}", "recovery.resume_drill"),
    ("name: ok\nrun: x\nrecovery: {standby_timeout: true}", "recovery.standby_timeout"),
]


@pytest.mark.parametrize("text,key", BAD)
def test_bad_job_file_names_the_key(text, key):
    """Each kind of mistake is reported with the dotted key at fault."""
    with pytest.raises(SpecError) as caught:
        parse_job(text, "job.yaml")
    assert any(problem.startswith((f"{key}:", f"{key}[")) for problem in caught.value.problems), caught.value.problems


def test_misspelt_key_suggests_the_right_one():
    """An unknown key close to a known one gets a 'did you mean'."""
    with pytest.raises(SpecError, match="did you mean 'interval'"):
        parse_job("name: ok\nrun: x\ncheckpoint: {intervall: 5m}")


def test_invalid_yaml_names_the_line():
    """Broken YAML is reported with its line number."""
    with pytest.raises(SpecError, match=r"line \d+: not valid YAML"):
        parse_job("name: ok\nrun: [unclosed\n")


def test_defaults_follow_the_contract():
    """Omitted sections take the contract's defaults."""
    spec = parse_job(GOOD)
    assert spec.resources.spot_policy == "spot"
    assert spec.checkpoint.interval == "auto" and spec.checkpoint.keep == 3
    assert spec.recovery.max_preemptions == 50 and spec.recovery.max_failures == 2
    assert spec.recovery.resume_drill_seconds() == 600


def test_drill_can_be_turned_off_and_accelerators_parse():
    """'off' disables the drill; NAME:COUNT splits into name and count."""
    spec = parse_job(GOOD + "recovery: {resume_drill: 'off'}\nresources: {accelerators: 'A100:8'}")
    assert spec.recovery.resume_drill_seconds() is None
    assert spec.resources.accelerator() == ("A100", 8)


def test_an_unquoted_off_turns_the_drill_off_and_numbers_keep_their_meaning():
    """YAML's unquoted off (read as false) disables the drill; whole numbers are accepted where a number is."""
    assert parse_job(GOOD + "recovery: {resume_drill: off}").recovery.resume_drill_seconds() is None
    spec = parse_job(GOOD + "resources: {memory_gb: 16, max_price_per_hour: 2}\ncheckpoint: {interval: 30}")
    assert (spec.resources.memory_gb, spec.resources.max_price_per_hour, spec.checkpoint.interval) == (16, 2, 30)


def test_workdir_resolves_against_the_job_files_folder(tmp_path: Path):
    """workdir is relative to the job file and must exist."""
    (tmp_path / "code").mkdir()
    (tmp_path / "job.yaml").write_text(GOOD + "workdir: code\n")
    assert load_job_file(tmp_path / "job.yaml").workdir == str((tmp_path / "code").resolve())
    (tmp_path / "job.yaml").write_text(GOOD + "workdir: missing\n")
    with pytest.raises(SpecError, match="workdir"):
        load_job_file(tmp_path / "job.yaml")


def test_missing_file_is_reported(tmp_path: Path):
    """A job file that does not exist is named."""
    with pytest.raises(SpecError, match="file not found"):
        load_job_file(tmp_path / "nope.yaml")


def test_validate_command_exits_2_with_the_key_and_no_traceback(tmp_path: Path, runner):
    """`runner validate` on a bad file exits 2 and names the key, without a traceback."""
    (tmp_path / "job.yaml").write_text("name: ok\nrun: x\ncheckpoint: {keep: 0}\n")
    result = runner("validate", str(tmp_path / "job.yaml"))
    assert result.returncode == 2
    assert "checkpoint.keep" in result.stderr and "Traceback" not in result.stderr
    (tmp_path / "job.yaml").write_text(GOOD)
    assert runner("validate", str(tmp_path / "job.yaml")).returncode == 0


def test_checked_in_json_schema_matches_the_model():
    """docs/job-schema.json is generated from the same model that validates job files."""
    checked_in = Path(__file__).resolve().parents[2] / "docs" / "job-schema.json"
    assert json.loads(checked_in.read_text()) == json.loads(json.dumps(job_json_schema()))


def test_accelerators_may_list_alternatives_in_order():
    """A list of NAME:COUNT alternatives keeps its order; a single NAME:COUNT stays one alternative."""
    spec = parse_job(GOOD + "resources: {accelerators: [A100:1, L4:1, T4:1]}")
    assert spec.resources.accelerator_options() == [("A100", 1), ("L4", 1), ("T4", 1)]
    assert parse_job(GOOD + "resources: {accelerators: 'L4:1'}").resources.accelerator_options() == [("L4", 1)]
    assert parse_job(GOOD).resources.accelerator_options() == []


def test_min_nodes_below_num_nodes_makes_a_gang_elastic_and_defaults_to_num_nodes():
    """Not set: num_nodes (not elastic); equal to num_nodes: not elastic either; below it: elastic."""
    plain = parse_job("name: ok\nrun: x\nresources: {num_nodes: 3}", "job.yaml").resources
    assert (plain.min_nodes, plain.fewest_nodes, plain.elastic) == (None, 3, False)
    assert not parse_job("name: ok\nrun: x\nresources: {num_nodes: 3, min_nodes: 3}", "job.yaml").resources.elastic
    elastic = parse_job("name: ok\nrun: x\nresources: {num_nodes: 3, min_nodes: 2}", "job.yaml").resources
    assert (elastic.fewest_nodes, elastic.elastic) == (2, True)
