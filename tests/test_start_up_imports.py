"""Processes started often load only what they use: a simulated node (once per launch) and the CLI's job
commands that read no job file (a test, a script or a person polling `runner status`) start without the store,
the job-file schema or pydantic, which cost them most of a second of CPU each; no process of the runner's own
(the CLI, the agent, the controller) loads torch or a cloud's SDK, seconds of CPU each, which only the job's
processes and a provider that calls its cloud need."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("runner.state", "runner.spec.schema", "runner.spec.load", "pydantic", "fsspec")
FRAMEWORKS = ("torch", "numpy", "transformers", "lightning", "boto3", "botocore", "google.cloud", "gcsfs", "s3fs")


def _loaded(code: str, heavy: tuple[str, ...] = HEAVY + FRAMEWORKS) -> set[str]:
    """The ``heavy`` modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport json, sys; print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout))


def test_a_simulated_node_starts_without_the_provider_behind_it():
    assert _loaded("import runner.providers.local.node, runner.providers.local.metadata") == set()


@pytest.mark.parametrize("command", ["status", "logs", "restarts", "jobs", "cancel", "preempt"])
def test_a_job_command_that_reads_no_job_file_starts_without_the_schema(command):
    code = f"from runner.cli.main import cli; cli.get_command(None, {command!r})"
    assert _loaded(code) == set()



def test_runner_help_starts_without_torch_or_a_cloud_sdk():
    code = ("from runner.cli.main import main\nimport contextlib, io\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n    assert main(['--help']) == 0\n"
            "assert 'submit' in out.getvalue()")
    assert _loaded(code) == set()


def test_the_agent_starts_without_torch_or_a_cloud_sdk():
    code = "from runner.cli.main import cli; cli.get_command(None, 'agent'); import agents.main, agents.supervisor"
    assert _loaded(code, FRAMEWORKS) == set()


def test_the_controller_starts_without_torch_or_a_cloud_sdk():
    code = ("from runner.cli.main import cli; cli.get_command(None, 'server')\n"
            "import runner.server, runner.controller.daemon")
    assert _loaded(code, FRAMEWORKS) == set()
