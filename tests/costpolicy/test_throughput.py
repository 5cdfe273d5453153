"""A job's expected steps/s on an offer: measured there, else its measurement elsewhere scaled by the catalog's
relative-throughput table, else unknown; and the cost policy comparing markets per step."""

from __future__ import annotations

import pytest

from runner.costpolicy import Market, decide
from runner.costpolicy.throughput import Measurement, Speed, describe, expected_speed
from runner.providers.catalog import relative_throughput
from runner.providers.offers import Offer

TABLE = {"T4": 1.0, "L4": 1.86, "A100": 4.8}


def offer(instance_type: str, accelerator: str | None, count: int = 1, cloud: str = "aws") -> Offer:
    return Offer(cloud, "r", "r-a", instance_type, accelerator, count, 4, 16.0, 0.2, 0.5)


T4_RUN = Measurement("aws", "g4dn.xlarge", "T4", 1, 3.0)


def test_a_type_the_job_ran_on_gives_its_own_measurement():
    assert expected_speed(offer("g4dn.xlarge", "T4"), [T4_RUN], TABLE) == Speed(3.0, "measured")


def test_another_type_is_estimated_from_the_measurement_scaled_by_the_table():
    """3 steps/s on a T4 makes 3 x 1.86 on an L4 and 3 x 4.8 x 8 on eight A100s."""
    l4 = expected_speed(offer("g6.xlarge", "L4"), [T4_RUN], TABLE)
    assert l4.steps_per_second == pytest.approx(5.58) and l4.how == "estimated from g4dn.xlarge"
    a100s = expected_speed(offer("p4d.24xlarge", "A100", 8), [T4_RUN], TABLE)
    assert a100s.steps_per_second == pytest.approx(3.0 * 4.8 * 8)
    back = expected_speed(offer("g4dn.2xlarge", "T4"), [Measurement("aws", "g6.xlarge", "L4", 1, 5.58)], TABLE)
    assert back.steps_per_second == pytest.approx(3.0)  # the same T4 in another size: the same speed


def test_the_newest_measurement_wins_and_an_unknown_accelerator_or_cpu_gives_no_figure():
    newer = Measurement("aws", "g6.xlarge", "L4", 1, 9.3)
    assert expected_speed(offer("p4d", "A100"), [newer, T4_RUN], TABLE).steps_per_second == pytest.approx(24.0)
    assert expected_speed(offer("x", "Z9000"), [T4_RUN], TABLE) is None
    assert expected_speed(offer("m5.large", None), [T4_RUN], TABLE) is None
    assert expected_speed(offer("g6.xlarge", "L4"), [], TABLE) is None  # nothing measured yet


def test_the_shipped_table_covers_every_accelerator_of_the_catalog():
    from runner.providers.catalog import known_accelerators

    table = relative_throughput()
    assert {name.upper() for name in known_accelerators()} <= set(table) and table["T4"] == 1.0
    assert table["A100"] > table["L4"] > table["T4"] and table["H100"] > table["A100"]


def test_the_message_gives_price_speed_and_price_per_1000_steps():
    assert describe("L4 spot in us-east-1b", 0.21, Speed(3.1, "measured")) == (
        "L4 spot in us-east-1b: $0.21/h at 3.1 steps/s measured = $0.0188/1k steps")


def test_the_deadline_policy_takes_the_cheaper_step_not_the_cheaper_hour():
    """Four times the speed for three times the price: the dearer hour is the cheaper step, on spot and on-demand."""
    slow = Market("a", True, 1.0, speed=1.0, name="slow")
    fast = Market("a", True, 3.0, speed=4.0, name="fast")
    decision = decide(now=0, deadline=48 * 3600, work_left=24 * 3600, restart=300, markets=[slow, fast,
                      Market("a", False, 3.0, speed=1.0), Market("a", False, 9.0, speed=4.0)])
    assert decision.market == fast and decision.reason.startswith("spot: 6.0 h of work left")
    tight = decide(now=0, deadline=6.5 * 3600, work_left=24 * 3600, restart=300, wait_step=3600,
                   markets=[Market("a", False, 1.0, speed=1.0), Market("a", False, 9.0, speed=4.0, name="fast")])
    assert tight.market.name == "fast"  # no spot, no time to wait, and only the fast one can still make it
    assert tight.reason.startswith("on-demand: 6.0 h of work left, 6.5 h to the deadline")
