"""The move from on-demand back to spot as a pure function of a clock, the spot offers, progress and prices."""

from __future__ import annotations

import pytest

from runner.costpolicy.decide import MOVE_HOLD_SECONDS, Market, decide, return_to_spot

HOUR = 3600.0
ON_DEMAND_PRICE = 3.0


def spot(zone="zone-a", price=1.0, rate=0.0) -> Market:
    return Market(zone, True, price, rate)


def weigh(**overrides):
    """A job on on-demand with 10 h of work left, 12 h to the deadline, 10-minute restarts, a 20 s stop."""
    args = dict(now=0.0, deadline=12 * HOUR, work_left=10 * HOUR, restart=600.0, markets=[spot()],
                on_demand_price=ON_DEMAND_PRICE, stop=20.0, margin=0.0, last_move=None)
    return return_to_spot(**{**args, **overrides})


def test_affordable_spot_is_moved_to_and_the_reason_gives_the_slack_and_the_saving():
    decision = weigh()
    assert decision.market == spot()
    # 10 h of work at $2/h less on spot, minus a 10-minute spot launch and a 20 s stop on on-demand
    assert decision.reason == ("moved to spot: 2.0 h of slack (10.0 h of work left, 12.0 h to the deadline), the "
                               "move and spot would need 10.2 h at the observed 0 preemptions/h, leaving 1.8 h for "
                               "a fallback to on-demand; spot in zone-a saves about $19.82")


def test_not_affordable_when_the_move_would_eat_the_reserve():
    """Slack 20 min: the spot launch (10 min) and the reserve (10 min) fit, the stop on top does not."""
    decision = weigh(deadline=10 * HOUR + 1200)
    assert decision.market is None
    assert decision.reason.startswith("staying on on-demand: 0.3 h of slack (10.0 h of work left, 10.3 h to the "
                                      "deadline), the move and spot would need 10.2 h")
    assert weigh(deadline=10 * HOUR + 1220).market == spot()  # 20 s more slack: the stop fits too


def test_the_observed_preemption_rate_counts_against_the_move():
    busy = spot(rate=1.0)  # 10 preemptions over the 10 h, 10 min each: 1.7 h more
    assert weigh(markets=[busy]).market is None
    assert weigh(markets=[busy], deadline=14 * HOUR).market == busy


def test_no_spot_offer_stays_on_on_demand():
    decision = weigh(markets=[])
    assert decision == weigh(markets=[Market("zone-a", False, ON_DEMAND_PRICE)])
    assert decision.market is None and decision.reason == "staying on on-demand: no spot capacity now"


def test_a_move_that_would_not_save_its_cost_is_not_made():
    """5 minutes of work left: the spot launch and the stop cost more than spot saves on it."""
    decision = weigh(work_left=300.0, deadline=2 * HOUR)
    assert decision.market is None and decision.reason.endswith("spot in zone-a would not save the move's cost")


@pytest.mark.parametrize("since, moves", [(0.0, False), (MOVE_HOLD_SECONDS - 1, False), (MOVE_HOLD_SECONDS, True)])
def test_hysteresis_no_second_move_within_the_hold(since, moves):
    decision = weigh(now=10 * HOUR, deadline=22 * HOUR, last_move=10 * HOUR - since)
    assert (decision.market is not None) == moves
    if not moves:
        assert decision.reason == (f"staying on on-demand: moved to spot {since / 60:.0f} min ago, at most one move "
                                   f"per {MOVE_HOLD_SECONDS / 60:.0f} min")


def test_the_cheapest_spot_by_expected_price_is_chosen():
    cheap_but_busy, calm = spot("zone-c", 0.9, 2.0), spot("zone-b", 1.0, 0.1)
    assert weigh(markets=[cheap_but_busy, calm], deadline=20 * HOUR).market == calm


def test_a_move_it_makes_is_one_the_launch_that_follows_takes_on_spot():
    """After the stop, the deadline placement (decide) must choose spot in the same market: one policy."""
    moves = 0
    for deadline in (10.35 * HOUR, 11 * HOUR, 12 * HOUR, 20 * HOUR):
        for rate in (0.0, 0.5, 2.0):
            markets = [spot(rate=rate), Market("zone-a", False, ON_DEMAND_PRICE)]
            move = weigh(markets=markets, deadline=deadline)
            if move.market is None:
                continue
            after_stop = decide(now=20.0, deadline=deadline, work_left=10 * HOUR, restart=600.0, markets=markets)
            assert after_stop.market == move.market, (deadline, rate)
            moves += 1
    assert moves >= 6
