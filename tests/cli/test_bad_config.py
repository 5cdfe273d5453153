"""A config.yaml mistake is bad input: the command exits 2 with one line naming the file, the key path and the
fix, whichever section (the top, scheduler:, a cloud's) holds it, and no controller is started."""

from __future__ import annotations

import pytest
import yaml

from conftest import Runner

AWS = {"regions": ["us-east-1"], "image_id": "ami-0abc"}


@pytest.fixture(autouse=True)
def no_controller_left(tmp_path):
    """Where a test fails because a controller did start, it is stopped: nothing outlives the test."""
    yield
    if (tmp_path / "controller.json").exists():
        Runner(tmp_path)("server", "stop")


@pytest.mark.parametrize("config, said", [
    ({"servr": "http://127.0.0.1:8470"}, "servr: unknown key (did you mean 'server'?)"),
    ({"clouds": {"azure": {}}}, "clouds.azure: unknown key (known keys: local, aws, gcp)"),
    ({"scheduler": {"gang_timeout": "0s"}}, "scheduler.gang_timeout: must be a positive duration such as 10m"),
    ({"clouds": "local"}, "clouds: must be a mapping such as {local: {}}"),
    ({"clouds": {"local": {"zone_capacty": 2}}}, "clouds.local.zone_capacty: unknown key (did you mean 'zone_capacity'?)"),
    ({"clouds": {"local": {"zones": "local-a"}}}, "clouds.local.zones: 'local-a' is not a list of zone names"),
    ({"clouds": {"local": {"zones": 5}}}, "clouds.local.zones: 5 is not a list of zone names"),
    ({"clouds": {"local": {"zones": ["local-a", "local-a"]}}}, "clouds.local.zones: lists local-a twice"),
])
def test_a_mistake_in_config_yaml_exits_2_naming_the_key(tmp_path, config, said):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    result = Runner(tmp_path)("jobs")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: {tmp_path / 'config.yaml'}: {said}"), result.stderr
    assert not (tmp_path / "controller.json").exists()


@pytest.mark.parametrize("aws, said", [
    ({**AWS, "imag_id": "ami-1"}, "clouds.aws.imag_id: unknown key (did you mean 'image_id'?)"),
    ({**AWS, "key_name": {"us-east-1": ""}}, "clouds.aws.key_name.us-east-1: '' is not a non-empty string"),
    ({**AWS, "refresh_prices": "yes"}, "clouds.aws.refresh_prices: must be true or false"),
])
def test_a_mistake_in_a_clouds_section_stops_the_server_with_exit_2(tmp_path, aws, said):
    pytest.importorskip("boto3")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"clouds": {"aws": aws}}))
    result = Runner(tmp_path)("server", "--port", "0", timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"error: {said}" in result.stderr


def test_a_value_the_local_market_refuses_at_start_is_exit_2_from_the_command_that_started_it(tmp_path):
    """A config.yaml value only the local controller checks (clouds.local.time_scale) is still bad input (exit 2)
    for the command that started that controller, naming the key, and leaves no controller running."""
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"clouds": {"local": {"time_scale": -1}}}))
    result = Runner(tmp_path)("jobs")
    assert result.returncode == 2, result.stderr
    assert "clouds.local.time_scale: -1 is not a positive number" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "controller.json").exists()
