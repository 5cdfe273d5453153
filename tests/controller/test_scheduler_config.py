"""config.yaml's scheduler section: checked, with messages that name the key."""

from __future__ import annotations

import pytest

from runner.home import ConfigError, scheduler_settings


def test_auto_on_demand_after_takes_a_duration_and_defaults_to_ten_minutes():
    """scheduler.auto_on_demand_after is read as a duration; without it the wait is 600 s."""
    assert scheduler_settings({"scheduler": {"auto_on_demand_after": "90s"}})["auto_on_demand_after"] == 90.0
    assert scheduler_settings({})["auto_on_demand_after"] == 600.0


def test_gang_timeout_takes_a_duration_and_defaults_to_ten_minutes():
    """scheduler.gang_timeout bounds the wait for a gang's nodes to register; without it the wait is 600 s."""
    assert scheduler_settings({"scheduler": {"gang_timeout": "45s"}})["gang_timeout"] == 45.0
    assert scheduler_settings({})["gang_timeout"] == 600.0


@pytest.mark.parametrize("config, named", [
    ({"scheduler": {"auto_on_demand_after": "soon"}}, "scheduler.auto_on_demand_after"),
    ({"scheduler": {"fallback": "1m"}}, "scheduler.fallback"),
    ({"scheduler": {"gang_timeout": "later"}}, "scheduler.gang_timeout"),
    ({"scheduler": "1m"}, "scheduler:"),
])
def test_a_scheduler_mistake_names_the_key(config, named):
    """A wrong scheduler section is a ConfigError naming the key at fault."""
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        scheduler_settings(config)
