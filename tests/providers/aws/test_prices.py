"""Live AWS spot prices, read with the real boto3 from moto's EC2 server on loopback.

moto reports 0.00001 for every spot price and never pages. ``SpotMarket`` sets real-looking prices and
pages the answers through botocore's public event hooks, so the request still travels to the server.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import boto3
import pytest
from botocore.config import Config
from moto.server import ThreadedMotoServer
from structlog.testing import capture_logs

from runner.providers.aws.prices import apply_spot_prices, newest_prices, price_problem, refresh_spot_prices
from runner.providers.catalog import load_catalog
from runner.providers.offers import Offer

NOW = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
OP = "ec2.DescribeSpotPriceHistory"


@pytest.fixture(scope="module")
def endpoint():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def ec2(endpoint: str, region: str = "us-east-1"):
    return boto3.client("ec2", region_name=region, endpoint_url=endpoint, aws_access_key_id="testing",
                        aws_secret_access_key="testing", config=Config(retries={"max_attempts": 1}))


class SpotMarket:
    """Sets spot prices on moto's answers and serves them in pages of ``MaxResults`` entries."""

    def __init__(self, client, prices: dict[tuple[str, str], float], older: dict | None = None):
        self.prices, self.older, self.calls = prices, older or {}, []
        client.meta.events.register(f"provide-client-params.{OP}", self._request)
        client.meta.events.register(f"after-call.{OP}", self._answer)

    def _request(self, params, context, **_):
        self.calls.append(dict(params))
        context["page"] = (int(params.get("NextToken") or 0), params.get("MaxResults") or 1000)

    def _answer(self, parsed, context, **_):
        entries = []
        for entry in parsed["SpotPriceHistory"]:
            key = (entry["InstanceType"], entry["AvailabilityZone"])
            if key in self.prices:
                entries.append({**entry, "SpotPrice": str(self.prices[key]), "Timestamp": NOW - timedelta(minutes=5)})
            if key in self.older:  # an older price, after the newer one, must not win
                entries.append({**entry, "SpotPrice": str(self.older[key]), "Timestamp": NOW - timedelta(hours=3)})
        start, size = context["page"]
        parsed["SpotPriceHistory"] = entries[start:start + size]
        parsed["NextToken"] = str(start + size) if start + size < len(entries) else ""


def east_offers() -> list[Offer]:
    return [o for o in load_catalog() if o.region == "us-east-1"]


def by_key(offers: list[Offer]) -> dict[tuple[str, str], Offer]:
    return {(o.instance_type, o.zone): o for o in offers}


def test_moto_prices_are_absurd_so_the_catalog_prices_stay_with_one_warning(endpoint):
    """moto's 0.00001 is below 1 % of on-demand: every offer keeps its catalog price and one warning says so."""
    offers = east_offers()
    with capture_logs() as logs:
        refreshed = refresh_spot_prices(ec2(endpoint), offers, now=NOW)
    assert refreshed == offers
    [warning] = [e for e in logs if e["log_level"] == "warning"]
    assert warning["count"] == len(offers) and "below 1% of on-demand" in warning["examples"][0]


def test_live_prices_replace_the_catalogs_per_zone(endpoint):
    """A plausible price for a type in a zone replaces that offer's spot price, and only that one."""
    client = ec2(endpoint)
    SpotMarket(client, {("g4dn.xlarge", "us-east-1a"): 0.25, ("g4dn.xlarge", "us-east-1b"): 0.1711})
    refreshed = by_key(refresh_spot_prices(client, east_offers(), now=NOW))
    assert refreshed["g4dn.xlarge", "us-east-1a"].spot_price == 0.25
    assert refreshed["g4dn.xlarge", "us-east-1b"].spot_price == 0.1711
    assert refreshed["g4dn.xlarge", "us-east-1c"] == by_key(east_offers())["g4dn.xlarge", "us-east-1c"]


def test_the_request_asks_for_current_linux_prices_of_the_catalogs_types(endpoint):
    """The call names the region's catalog types, Linux/UNIX, and StartTime now."""
    client = ec2(endpoint)
    market = SpotMarket(client, {})
    refresh_spot_prices(client, east_offers(), now=NOW)
    [call] = market.calls
    assert call["ProductDescriptions"] == ["Linux/UNIX"] and call["StartTime"] == NOW
    assert sorted(call["InstanceTypes"]) == sorted({o.instance_type for o in east_offers()})


def test_every_page_is_read(endpoint):
    """With pages of two entries the refresh follows NextToken to the last page."""
    client = ec2(endpoint)
    prices = {(t, z): p for t, p in (("g4dn.xlarge", 0.21), ("g5.xlarge", 0.41), ("p5.48xlarge", 12.5))
              for z in ("us-east-1a", "us-east-1b", "us-east-1c")}
    market = SpotMarket(client, prices)
    refreshed = by_key(refresh_spot_prices(client, east_offers(), now=NOW, page_size=2))
    assert len(market.calls) == 5 and {c["MaxResults"] for c in market.calls} == {2}
    assert {key: refreshed[key].spot_price for key in prices} == prices


def test_the_newest_price_per_type_and_zone_wins(endpoint):
    """An older entry that comes later in the answer does not override the newer price."""
    client = ec2(endpoint)
    key = ("g6.xlarge", "us-east-1c")
    SpotMarket(client, {key: 0.33}, older={key: 0.5})
    assert by_key(refresh_spot_prices(client, east_offers(), now=NOW))[key].spot_price == 0.33


def test_absurd_prices_fall_back_to_the_catalog_with_a_warning(endpoint):
    """Prices of zero or above 1.5 x on-demand are not used, and the warning names the offers."""
    client = ec2(endpoint)
    SpotMarket(client, {("g5.xlarge", "us-east-1a"): 0.0, ("g5.xlarge", "us-east-1b"): 9.99})
    with capture_logs() as logs:
        refreshed = by_key(refresh_spot_prices(client, east_offers(), now=NOW))
    catalog = by_key(east_offers())
    for zone in ("us-east-1a", "us-east-1b"):
        assert refreshed["g5.xlarge", zone] == catalog["g5.xlarge", zone]
    [warning] = [e for e in logs if e["log_level"] == "warning"]
    assert "g5.xlarge in us-east-1a: price 0 is not positive" in warning["examples"]
    assert "g5.xlarge in us-east-1b: price 9.99 is above 1.5 x on-demand 1.006" in warning["examples"]


def test_offers_of_other_regions_and_clouds_are_left_alone(endpoint):
    """A us-east-1 client changes neither us-west-2 nor GCP offers, and a client with none of them makes no call."""
    others = [o for o in load_catalog() if o.region != "us-east-1"]
    client = ec2(endpoint)
    market = SpotMarket(client, {})
    assert refresh_spot_prices(client, others, now=NOW) == others
    assert market.calls == []


def test_an_unreachable_api_keeps_the_catalog_prices():
    """When EC2 cannot be reached the offers come back unchanged and a warning gives the fix."""
    offers = east_offers()
    with capture_logs() as logs:
        assert refresh_spot_prices(ec2("http://127.0.0.1:9"), offers, now=NOW) == offers
    assert any("credentials" in e.get("fix", "") for e in logs)


def test_price_checks_in_plain_numbers():
    """A price is trusted between 1 % and 150 % of on-demand, and not when missing."""
    assert price_problem(0.2, 0.526) is None
    assert price_problem(0.78, 0.526) is None
    assert price_problem(None, 0.526) == "no price reported"
    assert "not positive" in price_problem(-1.0, 0.526)
    assert "above" in price_problem(0.8, 0.526)
    assert "below 1%" in price_problem(0.005, 0.526)


def test_unreadable_entries_are_skipped():
    """Entries with a price that is not a number, or without a zone, are ignored."""
    history = [{"InstanceType": "m5.large", "AvailabilityZone": "us-east-1a", "SpotPrice": "n/a"},
               {"InstanceType": "m5.large", "SpotPrice": "0.03"},
               {"InstanceType": "m5.large", "AvailabilityZone": "us-east-1b", "SpotPrice": "0.031"}]
    assert newest_prices(history) == {("m5.large", "us-east-1b"): 0.031}


def test_a_type_without_a_spot_market_gains_a_live_price():
    """An offer with no catalog spot price takes a plausible live one."""
    offer = Offer("aws", "us-east-1", "us-east-1a", "m5.large", None, 0, 2, 8, None, 0.096)
    [refreshed], fallbacks = apply_spot_prices([offer], {("m5.large", "us-east-1a"): 0.04}, "us-east-1")
    assert refreshed.spot_price == 0.04 and fallbacks == []
