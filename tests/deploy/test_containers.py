"""The container layouts (Kubernetes pod, docker compose) and the image agree with the agent and each other."""

from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest
import yaml

from agents.config import load_agent_config
from agents.main import SHUTDOWN_GRACE_SECONDS
from agents.reporter import REGISTER_PATIENCE_SECONDS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


@dataclass
class Layout:
    """What matters of one sidecar layout, read from its files."""

    agent_config: object  # agents.config.AgentConfig
    agent_argv: list[str]
    agent_env: dict[str, str]
    agent_mounts: dict[str, str]  # mount path -> volume
    train_mounts: dict[str, str]
    train_env: dict[str, str]
    grace_seconds: float  # from SIGTERM to SIGKILL
    uids: list[int]  # the uid each container runs as


def _duration(text: str) -> float:
    return sum(float(n) * {"s": 1, "m": 60}[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([sm])", text))


def kubernetes(tmp_path: Path) -> Layout:
    docs = {doc["kind"]: doc for f in sorted((DEPLOY / "kubernetes").glob("*.yaml"))
            for doc in yaml.safe_load_all(f.read_text()) if doc}
    pod, secret = docs["Pod"]["spec"], docs["Secret"]
    agent, train = pod["initContainers"][0], pod["containers"][0]
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_mount = next(m for m in agent["volumeMounts"] if "secret" in volumes[m["name"]])
    assert volumes[config_mount["name"]]["secret"]["secretName"] == secret["metadata"]["name"]
    config_file = tmp_path / "agent.yaml"
    config_file.write_text(secret["stringData"]["agent.yaml"])
    argv = agent["args"]
    assert str(PurePosixPath(config_mount["mountPath"]) / "agent.yaml") == argv[argv.index("--config") + 1]
    uid = pod["securityContext"]["runAsUser"]
    return Layout(
        agent_config=load_agent_config(config_file), agent_argv=argv,
        agent_env={e["name"]: e["value"] for e in agent.get("env", [])},
        agent_mounts={m["mountPath"]: m["name"] for m in agent["volumeMounts"] if "emptyDir" in volumes[m["name"]]},
        train_mounts={m["mountPath"]: m["name"] for m in train["volumeMounts"]},
        train_env={e["name"]: e["value"] for e in train["env"]},
        grace_seconds=pod["terminationGracePeriodSeconds"],
        uids=[c.get("securityContext", {}).get("runAsUser", uid) for c in (agent, train)],
    )


def compose(tmp_path: Path) -> Layout:
    spec = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    agent, train = spec["services"]["agent"], spec["services"]["train"]
    named = set(spec["volumes"])

    def mounts(service: dict) -> dict[str, str]:
        pairs = [v.split(":")[:2] for v in service["volumes"]]
        return {target: source for source, target in pairs if source in named}

    config_source = next(v.split(":")[0] for v in agent["volumes"] if v.split(":")[0] not in named)
    assert config_source == "./agent.yaml"  # made from agent.example.yaml, which must be valid
    argv = agent["command"]
    return Layout(
        agent_config=load_agent_config(DEPLOY / "agent.example.yaml"), agent_argv=argv,
        agent_env=agent.get("environment", {}),
        agent_mounts=mounts(agent), train_mounts=mounts(train), train_env=train["environment"],
        grace_seconds=min(_duration(agent["stop_grace_period"]), _duration(train["stop_grace_period"])),
        uids=[int(s["user"].split(":")[0]) for s in (agent, train)],
    )


LAYOUTS = {"kubernetes": kubernetes, "compose": compose}


@pytest.fixture(params=sorted(LAYOUTS))
def layout(request, tmp_path: Path) -> Layout:
    return LAYOUTS[request.param](tmp_path)


def _dockerfile_final_stage() -> list[str]:
    lines = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text()).splitlines()
    stages = [i for i, line in enumerate(lines) if line.upper().startswith("FROM ")]
    return [line.strip() for line in lines[stages[-1]:] if line.strip() and not line.startswith("#")]


def _image_uid() -> int:
    user = [line.split()[1] for line in _dockerfile_final_stage() if line.upper().startswith("USER ")][-1]
    return int(user.split(":")[0])


def test_agent_runs_in_sidecar_mode(layout: Layout):
    """The agent's config puts it in sidecar mode: it serves the training container and never runs a job itself."""
    assert layout.agent_config.mode == "sidecar"


def test_agent_log_reaches_the_container_log(layout: Layout):
    """The agent container sets RUNNER_LOG_STDERR=1, so `kubectl logs` and `docker compose logs` show its log."""
    assert layout.agent_env.get("RUNNER_LOG_STDERR") == "1"


def test_agent_scratch_dir_is_the_shared_volume(layout: Layout):
    """The agent's scratch_dir is a volume the training container mounts at the same path."""
    scratch = str(layout.agent_config.scratch_dir)
    assert scratch in layout.agent_mounts
    assert layout.train_mounts.get(scratch) == layout.agent_mounts[scratch]


def test_training_finds_the_agents_control_socket(layout: Layout):
    """RUNNER_CONTROL in the training container is the socket the agent listens on, inside the shared volume."""
    assert layout.train_env["RUNNER_CONTROL"] == str(layout.agent_config.control_socket)


def test_fast_checkpoint_tier_is_on_the_shared_volume(layout: Layout):
    """RUNNER_CHECKPOINT_DIR lies inside the volume both containers mount."""
    checkpoint_dir = PurePosixPath(layout.train_env["RUNNER_CHECKPOINT_DIR"])
    assert any(checkpoint_dir.is_relative_to(mount) for mount in layout.train_mounts)


def test_grace_period_covers_the_emergency_checkpoint(layout: Layout):
    """The training process's signal deadline, and the agent's, end before the container is killed."""
    signal_grace = float(layout.train_env["RUNNER_SIGNAL_GRACE_SECONDS"])
    assert 0 < signal_grace < layout.grace_seconds
    assert SHUTDOWN_GRACE_SECONDS < layout.grace_seconds


def test_both_containers_run_as_the_images_user(layout: Layout):
    """Agent and training container share the image's non-root uid, so the training process may use the 0600 socket."""
    assert layout.uids == [_image_uid(), _image_uid()] and _image_uid() != 0


def test_agent_container_runs_the_agent(layout: Layout):
    """The sidecar runs `runner agent --config FILE` (the image's entrypoint is `runner`)."""
    assert layout.agent_argv[0] == "agent" and "--config" in layout.agent_argv


def test_kubernetes_agent_is_a_native_sidecar():
    """The agent is an init container with restartPolicy Always, whose startup probe outlasts registration."""
    pod = next(doc for doc in yaml.safe_load_all((DEPLOY / "kubernetes" / "training-pod.yaml").read_text()))
    agent = pod["spec"]["initContainers"][0]
    probe = agent["startupProbe"]
    assert agent["restartPolicy"] == "Always"
    assert probe["exec"]["command"][:2] == ["runner-healthcheck", "agent"]
    assert probe["periodSeconds"] * probe["failureThreshold"] > REGISTER_PATIENCE_SECONDS
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def test_compose_starts_training_once_the_agent_is_healthy():
    """`train` waits for the agent's health check, which allows for registration, and is stopped before it."""
    spec = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert spec["services"]["train"]["depends_on"]["agent"]["condition"] == "service_healthy"
    check = spec["services"]["agent"]["healthcheck"]
    assert check["test"][1:3] == ["runner-healthcheck", "agent"]
    assert _duration(check["start_period"]) > REGISTER_PATIENCE_SECONDS


def test_image_runs_as_a_numeric_non_root_user():
    """The image's final USER is a numeric uid other than 0 (Kubernetes can only verify runAsNonRoot then)."""
    assert _image_uid() > 0


def test_image_health_check_is_the_shipped_script():
    """HEALTHCHECK runs runner-healthcheck, which the image copies from deploy/healthcheck.py."""
    stage = _dockerfile_final_stage()
    check = next(line for line in stage if line.upper().startswith("HEALTHCHECK "))
    assert "runner-healthcheck" in check
    copies = [shlex.split(line)[1:] for line in stage if line.upper().startswith("COPY ")]
    assert any(args[-2:] == ["deploy/healthcheck.py", "/usr/local/bin/runner-healthcheck"] for args in copies)


def test_image_health_check_allows_for_registration():
    """The image's health check gives the agent longer than its registration patience before counting failures."""
    check = next(line for line in _dockerfile_final_stage() if line.upper().startswith("HEALTHCHECK "))
    start_period = re.search(r"--start-period=(\S+)", check).group(1)
    assert _duration(start_period) > REGISTER_PATIENCE_SECONDS


def test_build_context_holds_what_the_dockerfile_copies():
    """Every path the Dockerfile copies from the context exists and is not excluded by .dockerignore."""
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    lines = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text()).splitlines()
    sources = [source for line in lines if line.upper().startswith("COPY ")
               for source in [a for a in shlex.split(line)[1:] if not a.startswith("--")][:-1]]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        excluded = [p for p in ignored if fnmatch.fnmatch(source, p) or fnmatch.fnmatch(source.split("/")[0], p)]
        assert not excluded, f"{source} is excluded by {excluded}"
