"""The local provider's simulated market, where it needs no node process: stockouts and full zones."""

from __future__ import annotations

import pytest

from runner.providers.base import LaunchRequest, NodeBootstrap
from runner.providers.errors import NoCapacityError
from runner.providers.local import LocalProvider


def _request(provider: LocalProvider, zone: str) -> LaunchRequest:
    offer = next(o for o in provider.offers() if o.zone == zone)
    return LaunchRequest("n-1", "job-1", 1, offer, True, NodeBootstrap("http://controller", "n-1", "token"))


def test_a_zone_named_in_no_capacity_refuses_launches_as_a_stockout(tmp_path):
    """clouds.local.no_capacity: a launch there raises NoCapacityError and starts nothing."""
    provider = LocalProvider(tmp_path, no_capacity=["local-a"])
    with pytest.raises(NoCapacityError, match="local-a"):
        provider.launch(_request(provider, "local-a"))
    assert not provider.node_dir("n-1").exists()


def test_a_zone_capacity_that_is_not_a_positive_whole_number_is_refused_naming_the_key(tmp_path):
    """clouds.local.zone_capacity: 0 is refused with the key's name."""
    with pytest.raises(ValueError, match="clouds.local.zone_capacity"):
        LocalProvider(tmp_path, zone_capacity=0)
