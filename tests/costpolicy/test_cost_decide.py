"""The cost policy's decision and Uniform Progress's rules as pure functions of a clock, offers and progress."""

from __future__ import annotations

import pytest

from runner.costpolicy.decide import Market, decide, spot_seconds_needed
from runner.costpolicy.uniform_progress import IDLE, ON_DEMAND, SPOT, UniformProgress

HOUR = 3600.0
ON_DEMAND_MARKET = Market("zone-a", False, 3.0)


def spot(zone="zone-a", price=1.0, rate=0.0) -> Market:
    return Market(zone, True, price, rate)


def test_ample_slack_takes_spot_and_says_how_much_room_is_left():
    decision = decide(now=0, deadline=15 * HOUR, work_left=10 * HOUR, restart=600,
                      markets=[spot(), ON_DEMAND_MARKET])
    assert decision.market == spot()
    assert decision.reason == ("spot: 10.0 h of work left, 15.0 h to the deadline, spot would need 10.2 h at the "
                               "observed 0 preemptions/h, leaving 4.8 h for a fallback to on-demand")


def test_spot_too_slow_at_the_observed_preemption_rate_goes_on_demand():
    """14.2 h of work, 15 h left: 3 preemptions/h of 116 s restarts make spot need 15.6 h."""
    restart = 116.0
    assert spot_seconds_needed(14.2 * HOUR, restart, 3.0) / HOUR == pytest.approx(15.6, abs=0.01)
    decision = decide(now=0, deadline=15 * HOUR, work_left=14.2 * HOUR, restart=restart,
                      markets=[spot(rate=3.0), ON_DEMAND_MARKET])
    assert decision.market == ON_DEMAND_MARKET
    assert decision.reason == ("on-demand: 14.2 h of work left, 15.0 h to the deadline, spot would need 15.6 h "
                               "at the observed 3 preemptions/h")


def test_the_same_job_without_preemptions_would_take_spot():
    decision = decide(now=0, deadline=15 * HOUR, work_left=14.2 * HOUR, restart=116.0,
                      markets=[spot(rate=0.0), ON_DEMAND_MARKET])
    assert decision.market.spot


def test_the_zone_with_the_lowest_expected_price_wins():
    """Equal prices: the zone that preempts less; a cheaper zone wins unless its preemptions cost more."""
    calm, busy = spot("zone-b", 1.0, 0.1), spot("zone-a", 1.0, 2.0)
    markets = [busy, calm, ON_DEMAND_MARKET]
    assert decide(now=0, deadline=40 * HOUR, work_left=10 * HOUR, restart=900, markets=markets).market == calm
    cheap_but_busy = spot("zone-c", 0.9, 2.0)  # 0.9 x (1 + 2 x 0.25) = 1.35 per hour of work
    assert decide(now=0, deadline=40 * HOUR, work_left=10 * HOUR, restart=900,
                  markets=[cheap_but_busy, calm, ON_DEMAND_MARKET]).market == calm


def test_without_spot_capacity_it_waits_while_slack_allows_then_goes_on_demand():
    """Stepping a clock by 10 minutes: it waits until the wait would leave less than a launch and the margin."""
    work, restart, margin, step = 10 * HOUR, 600.0, 300.0, 600.0
    deadline = 12 * HOUR
    now, choices = 0.0, []
    while now < deadline:
        decision = decide(now=now, deadline=deadline, work_left=work, restart=restart,
                          markets=[ON_DEMAND_MARKET], margin=margin, wait_step=step)
        choices.append((now, decision.market))
        if decision.market is not None:
            break
        assert decision.reason.startswith("waiting for spot: no spot capacity now")
        now += step
    # slack 2 h; it waits while 2 h - elapsed - 10 min >= 15 min: the last wait is at 1 h 30 min
    assert choices[-1] == (6000.0, ON_DEMAND_MARKET)
    assert deadline - choices[-1][0] >= work + restart  # and on-demand still finishes in time


def test_a_deadline_that_cannot_be_met_any_more_runs_on_demand_and_says_so():
    decision = decide(now=0, deadline=5 * HOUR, work_left=6 * HOUR, restart=300, markets=[spot(), ON_DEMAND_MARKET])
    assert decision.market == ON_DEMAND_MARKET
    assert decision.reason.startswith("on-demand: the deadline cannot be met any more (6.0 h of work left, 5.0 h")


def test_the_reserve_keeps_room_for_one_restart_after_a_preemption():
    """Spot is taken only while a preemption at any moment still leaves time for an on-demand launch."""
    restart = 600.0
    tight = decide(now=0, deadline=10 * HOUR + 2 * restart - 1, work_left=10 * HOUR, restart=restart,
                   markets=[spot(), ON_DEMAND_MARKET])
    enough = decide(now=0, deadline=10 * HOUR + 2 * restart, work_left=10 * HOUR, restart=restart,
                    markets=[spot(), ON_DEMAND_MARKET])
    assert tight.market == ON_DEMAND_MARKET and enough.market.spot


# --- Uniform Progress (the paper's rules) ---------------------------------------------------------


def rules() -> UniformProgress:
    return UniformProgress(total_work=10 * HOUR, deadline=20 * HOUR, changeover=0.25 * HOUR)


def test_up_takes_spot_whenever_available_even_when_behind():
    assert rules().step(elapsed=10 * HOUR, done=1 * HOUR, current=IDLE, spot_available=True) == SPOT


def test_up_idles_when_ahead_and_catches_up_on_demand_when_behind():
    up = rules()
    assert up.step(elapsed=4 * HOUR, done=3 * HOUR, current=IDLE, spot_available=False) == IDLE  # ep = 2 h
    assert up.step(elapsed=8 * HOUR, done=3 * HOUR, current=IDLE, spot_available=False) == ON_DEMAND  # ep = 4 h


def test_up_stays_on_demand_until_ahead_of_the_line_two_changeovers_on():
    up = rules()
    # ep(t + 2d) at t = 8 h is 4.25 h: at 4.2 h done it stays, even with spot available
    assert up.step(elapsed=8 * HOUR, done=4.2 * HOUR, current=ON_DEMAND, spot_available=True) == ON_DEMAND
    assert up.step(elapsed=8 * HOUR, done=4.3 * HOUR, current=ON_DEMAND, spot_available=True) == SPOT


def test_up_safety_net_is_on_demand_to_the_end():
    up = rules()
    # idle with 5.4 h left for 5 h of work: R < C + 2d, so on-demand, and it stays there even with spot
    assert up.step(elapsed=14.6 * HOUR, done=5 * HOUR, current=IDLE, spot_available=False) == ON_DEMAND
    assert up.step(elapsed=15 * HOUR, done=5.4 * HOUR, current=ON_DEMAND, spot_available=True) == ON_DEMAND
