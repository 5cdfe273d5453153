"""The offer policy: fitting, ranking, backoff, explanations and the `runner offers` filter."""

from __future__ import annotations

import json

import pytest

from runner.providers.offers import Offer
from runner.scheduler.policy import (
    BACKOFF_CAP_SECONDS,
    BackoffBook,
    Candidate,
    explain_unsatisfiable,
    filter_offers,
    fits,
    rank_offers,
)
from runner.scheduler.isolation import capped_doubling
from runner.spec.schema import Resources


def offer(zone="us-east-1a", itype="g4dn.xlarge", acc="T4", count=1, cpus=4, mem=16.0, spot=0.20, od=0.526,
          cloud="aws", region=None) -> Offer:
    region = region or zone[:-1]
    return Offer(cloud, region, zone, itype, acc, count, cpus, mem, spot, od)


T4_A = offer("us-east-1a", spot=0.20)
T4_B = offer("us-east-1b", spot=0.19)
T4_C = offer("us-east-1c", spot=0.22)
A100 = offer("us-east-1a", "p4d.24xlarge", "A100", 8, 96, 1152, 2.47, 21.96)
CPU = offer("us-east-1a", "m5.large", None, 0, 2, 8, 0.037, 0.096)
GCP_T4 = offer("us-central1-a", "n1-standard-4", cpus=4, mem=15, spot=0.215, od=0.54, cloud="gcp",
               region="us-central1")
MARKET = [T4_A, T4_B, T4_C, A100, CPU, GCP_T4]


def res(**fields) -> Resources:
    return Resources(**fields)


def zones(candidates: list[Candidate]) -> list[str]:
    return [c.offer.zone for c in candidates]


# --- fits ------------------------------------------------------------------------------------------


def test_an_offer_that_meets_everything_fits():
    """fits() is None when every constraint holds."""
    assert fits(T4_A, res(accelerators="T4:1", cpus=4, memory_gb=16, cloud=["aws"], regions=["us-east-1"],
                          max_price_per_hour=0.2)) is None


@pytest.mark.parametrize("resources, failed", [
    (dict(accelerators="A100:8"), "accelerators"),
    (dict(accelerators="T4:4"), "accelerators"),
    (dict(), "accelerators"),  # a CPU-only job does not take a GPU node
    (dict(accelerators="T4:1", cpus=8), "cpus"),
    (dict(accelerators="T4:1", memory_gb=32), "memory_gb"),
    (dict(accelerators="T4:1", cloud=["gcp"]), "cloud"),
    (dict(accelerators="T4:1", regions=["us-west-2"]), "regions"),
    (dict(accelerators="T4:1", max_price_per_hour=0.1), "max_price_per_hour"),
    (dict(accelerators="A100:8", cpus=8, cloud=["gcp"]), "accelerators"),
])
def test_fits_names_the_first_constraint_that_fails(resources, failed):
    """fits() names the first failing constraint in the order accelerators, cpus, memory, cloud, regions, price."""
    assert fits(T4_A, res(**resources)) == failed


def test_accelerator_names_match_in_any_case():
    """'t4:1' fits a T4 offer."""
    assert fits(T4_A, res(accelerators="t4:1")) is None


def test_a_region_list_may_name_a_zone():
    """regions: [us-east-1a] admits offers in that zone only."""
    assert fits(T4_A, res(accelerators="T4:1", regions=["us-east-1a"])) is None
    assert fits(T4_B, res(accelerators="T4:1", regions=["us-east-1a"])) == "regions"


def test_the_price_cap_applies_to_the_price_the_policy_pays():
    """A cap between the spot and the on-demand price admits spot and auto jobs but not on-demand ones."""
    assert fits(T4_A, res(accelerators="T4:1", max_price_per_hour=0.3)) is None
    assert fits(T4_A, res(accelerators="T4:1", max_price_per_hour=0.3, spot_policy="auto")) is None
    assert fits(T4_A, res(accelerators="T4:1", max_price_per_hour=0.3, spot_policy="on-demand")) == "max_price_per_hour"


def test_a_spot_job_does_not_fit_an_offer_without_a_spot_market():
    """spot_policy spot needs a spot price; on-demand and auto do not."""
    no_spot = offer(spot=None)
    assert fits(no_spot, res(accelerators="T4:1")) == "spot_policy"
    assert fits(no_spot, res(accelerators="T4:1", spot_policy="on-demand")) is None
    assert fits(no_spot, res(accelerators="T4:1", spot_policy="auto")) is None


# --- rank_offers -----------------------------------------------------------------------------------


def test_spot_jobs_get_spot_candidates_cheapest_first():
    """spot_policy spot ranks the fitting offers by spot price, spot only."""
    ranked = rank_offers(MARKET, res(accelerators="T4:1"), now=0)
    assert [(c.offer.zone, c.spot, c.price) for c in ranked] == [
        ("us-east-1b", True, 0.19), ("us-east-1a", True, 0.20), ("us-central1-a", True, 0.215),
        ("us-east-1c", True, 0.22)]


def test_on_demand_jobs_get_on_demand_prices():
    """spot_policy on-demand ranks by on-demand price, on-demand only."""
    ranked = rank_offers(MARKET, res(accelerators="T4:1", spot_policy="on-demand"), now=0)
    assert {c.spot for c in ranked} == {False}
    assert [c.price for c in ranked] == [0.526, 0.526, 0.526, 0.54]


def test_auto_gives_spot_only_until_the_fallback_then_spot_before_on_demand():
    """auto is spot only; with on_demand_fallback every spot candidate comes before the on-demand ones."""
    resources = res(accelerators="T4:1", spot_policy="auto")
    assert {c.spot for c in rank_offers(MARKET, resources, now=0)} == {True}
    ranked = rank_offers(MARKET, resources, now=0, on_demand_fallback=True)
    assert [c.spot for c in ranked] == [True] * 4 + [False] * 4


def test_auto_falls_back_to_on_demand_where_there_is_no_spot_market():
    """With the fallback, an auto job can launch on an offer that has no spot market."""
    ranked = rank_offers([offer(spot=None)], res(accelerators="T4:1", spot_policy="auto"), now=0,
                         on_demand_fallback=True)
    assert [(c.spot, c.price) for c in ranked] == [(False, 0.526)]


def test_ties_are_broken_by_cloud_region_zone_and_type():
    """Equal prices order by cloud, then region, zone and instance type, whatever the input order."""
    same = [offer("us-west-2b", spot=0.2), offer("us-east-1b", spot=0.2), offer("us-east-1a", "g4dn.2xlarge", spot=0.2),
            offer("us-east-1a", spot=0.2), offer("us-central1-a", cloud="gcp", region="us-central1", spot=0.2)]
    expected = [("aws", "us-east-1a", "g4dn.2xlarge"), ("aws", "us-east-1a", "g4dn.xlarge"),
                ("aws", "us-east-1b", "g4dn.xlarge"), ("aws", "us-west-2b", "g4dn.xlarge"),
                ("gcp", "us-central1-a", "g4dn.xlarge")]
    for order in (same, same[::-1]):
        ranked = rank_offers(order, res(accelerators="T4:1"), now=0)
        assert [(c.offer.cloud, c.offer.zone, c.offer.instance_type) for c in ranked] == expected


def test_nothing_fitting_gives_an_empty_list():
    """No fitting offer, or no offers at all, gives no candidates."""
    assert rank_offers(MARKET, res(accelerators="H100:8"), now=0) == []
    assert rank_offers([], res(), now=0) == []


def test_the_price_cap_drops_dearer_candidates():
    """Candidates above max_price_per_hour are left out."""
    ranked = rank_offers(MARKET, res(accelerators="T4:1", max_price_per_hour=0.2), now=0)
    assert zones(ranked) == ["us-east-1b", "us-east-1a"]


def test_the_price_cap_keeps_spot_but_drops_on_demand_for_auto():
    """For auto with the fallback, a cap between the prices keeps the spot candidates only."""
    ranked = rank_offers([T4_A], res(accelerators="T4:1", spot_policy="auto", max_price_per_hour=0.3), now=0,
                         on_demand_fallback=True)
    assert [c.spot for c in ranked] == [True]


def test_avoided_zones_go_last_rather_than_vanishing():
    """A zone that preempted the job recently is tried after every other zone, in price order."""
    ranked = rank_offers(MARKET, res(accelerators="T4:1"), now=0, avoid_zones={"us-east-1b", "us-central1-a"})
    assert zones(ranked) == ["us-east-1a", "us-east-1c", "us-east-1b", "us-central1-a"]


def test_a_job_preempted_in_every_zone_still_launches():
    """When every zone is avoided the candidates are all still there, cheapest first."""
    ranked = rank_offers(MARKET, res(accelerators="T4:1", cloud=["aws"]), now=0,
                         avoid_zones={"us-east-1a", "us-east-1b", "us-east-1c"})
    assert zones(ranked) == ["us-east-1b", "us-east-1a", "us-east-1c"]


def test_backed_off_offers_are_left_out_until_the_backoff_expires():
    """A type backed off in a zone is skipped for 30 s after one failure, then offered again."""
    book = BackoffBook()
    book.record_failure(("aws", "us-east-1b", "g4dn.xlarge"), now=100)
    resources = res(accelerators="T4:1", cloud=["aws"])
    assert zones(rank_offers(MARKET, resources, backoff=book, now=129)) == ["us-east-1a", "us-east-1c"]
    assert zones(rank_offers(MARKET, resources, backoff=book, now=130))[0] == "us-east-1b"


def test_a_backed_off_zone_excludes_every_type_in_it():
    """A (cloud, zone) backoff leaves out every offer of that zone."""
    book = BackoffBook()
    book.record_failure(("aws", "us-east-1a"), now=0)
    assert [c.offer for c in rank_offers(MARKET, res(accelerators="A100:8"), backoff=book, now=1)] == []
    assert "us-east-1a" not in zones(rank_offers(MARKET, res(accelerators="T4:1"), backoff=book, now=1))


# --- BackoffBook -----------------------------------------------------------------------------------

KEY = ("aws", "us-east-1a", "p5.48xlarge")


def test_backoff_doubles_from_30_seconds_up_to_30_minutes():
    """Each failure doubles the backoff: 30, 60, 120 ... capped at 1800 seconds."""
    book = BackoffBook()
    seconds = [book.record_failure(KEY, now=0) for _ in range(9)]
    assert seconds == [30, 60, 120, 240, 480, 960, 1800, 1800, 1800]
    assert book.is_backed_off(KEY, 1799) and not book.is_backed_off(KEY, 1800)


def test_the_backoff_stays_at_its_cap_after_ten_thousand_failures():
    """A market that refuses every launch for hours: the 1,025th failure once overflowed the float and stopped
    every reconciler tick; the backoff is the cap for any count."""
    book = BackoffBook()
    seconds = [book.record_failure(KEY, now=0) for _ in range(10_000)]
    assert seconds[-1] == BACKOFF_CAP_SECONDS and set(seconds[6:]) == {BACKOFF_CAP_SECONDS}


def test_capped_doubling_never_overflows():
    """The one formula behind every capped exponential backoff, at counts far past a float's range."""
    assert [capped_doubling(0.5, n, 10.0) for n in (1, 2, 3, 5, 6)] == [0.5, 1.0, 2.0, 8.0, 10.0]
    for failures in (1_025, 10_000, 10**18):
        assert capped_doubling(30.0, failures, 1800.0) == 1800.0
    assert capped_doubling(1e-300, 10**6, 1e300) == 1e300


def test_a_success_clears_the_backoff_of_the_type_and_its_zone():
    """After a successful launch the type and its zone may be tried at once, from the base again."""
    book = BackoffBook()
    book.record_failure(KEY, now=0)
    book.record_failure(("aws", "us-east-1a"), now=0)
    book.record_success(KEY, now=5)
    assert not book.is_backed_off(KEY, 5) and not book.is_backed_off(("aws", "us-east-1a"), 5)
    assert book.record_failure(KEY, now=6) == 30


def test_an_old_failure_is_forgotten():
    """A key whose backoff ended more than the cap ago starts again from 30 seconds."""
    book = BackoffBook()
    book.record_failure(KEY, now=0)
    book.record_failure(KEY, now=40)  # 60 s, until 100
    assert book.record_failure(KEY, now=100 + BACKOFF_CAP_SECONDS + 1) == 30


def test_two_types_failing_in_one_zone_back_off_the_zone():
    """When two instance types of one zone are backed off at once, the whole zone is backed off."""
    book = BackoffBook()
    book.record_failure(("aws", "us-east-1a", "p5.48xlarge"), now=0)
    assert not book.is_backed_off(("aws", "us-east-1a"), 1)
    book.record_failure(("aws", "us-east-1a", "p4d.24xlarge"), now=1)
    assert book.is_backed_off(("aws", "us-east-1a"), 2)
    assert not book.is_backed_off(("aws", "us-east-1b"), 2)


def test_the_book_round_trips_through_json():
    """to_dict() is JSON-ready and from_dict() restores the same backoffs and failure counts."""
    book = BackoffBook()
    book.record_failure(KEY, now=0)
    book.record_failure(KEY, now=0)
    book.record_failure(["gcp", "us-central1-a"], now=10)
    again = BackoffBook.from_dict(json.loads(json.dumps(book.to_dict())))
    assert again == book
    assert again.remaining(KEY, now=0) == 60 and again.is_backed_off(("gcp", "us-central1-a"), 39)
    assert again.record_failure(KEY, now=0) == 120


def test_bad_keys_and_bad_data_are_rejected_with_the_fix():
    """A key of the wrong shape and malformed stored data raise ValueError saying what to do."""
    with pytest.raises(ValueError, match="cloud, zone"):
        BackoffBook().record_failure(("aws",), now=0)
    with pytest.raises(ValueError, match="delete the stored book"):
        BackoffBook.from_dict({"entries": [{"key": ["aws", "z"]}]})


# --- explain_unsatisfiable -------------------------------------------------------------------------


def test_a_satisfiable_job_needs_no_explanation():
    """A job some offer fits gets None, even if that offer is backed off now."""
    assert explain_unsatisfiable(MARKET, res(accelerators="T4:1")) is None


def test_a_price_cap_below_every_offer_names_the_cheapest():
    """The message names the cap and the cheapest offer that fits apart from it."""
    assert explain_unsatisfiable(MARKET, res(accelerators="T4:1", cloud=["aws"], max_price_per_hour=0.1)) == (
        "max_price_per_hour 0.10 is below every fitting offer; the cheapest is g4dn.xlarge in us-east-1b at $0.19/h spot")


def test_an_unknown_accelerator_lists_the_known_ones():
    """A GPU name nobody offers gives the list of known names."""
    message = explain_unsatisfiable(MARKET, res(accelerators="X100:1"))
    assert "unknown accelerator 'X100'" in message
    assert all(name in message for name in ("A100", "H100", "L4", "T4"))


def test_a_count_nobody_offers_lists_the_counts_offered():
    """T4:2 when T4 comes as 1 names the counts and the cheapest T4 offer."""
    assert explain_unsatisfiable(MARKET, res(accelerators="t4:2")) == (
        "accelerators t4:2 is not offered (T4 comes as T4:1); the cheapest T4:1 offer is "
        "g4dn.xlarge in us-east-1b at $0.19/h spot")


@pytest.mark.parametrize("resources, start", [
    (dict(accelerators="T4:1", cpus=64), "cpus 64 is more than every fitting offer has (at most 4)"),
    (dict(accelerators="T4:1", memory_gb=64), "memory_gb 64 is more than every fitting offer has (at most 16)"),
    (dict(accelerators="A100:8", regions=["us-west-2"]), "regions us-west-2 have no fitting offer"),
    (dict(accelerators="A100:8", cloud=["gcp"]), "cloud gcp has no fitting offer"),
    (dict(cpus=4), "cpus 4 is more than every fitting offer has (at most 2)"),
])
def test_each_blocking_constraint_is_named(resources, start):
    """The one constraint that keeps every offer out is named first in the message."""
    assert explain_unsatisfiable(MARKET, res(**resources)).startswith(start)


def test_a_cloud_that_is_not_configured_points_to_its_guide():
    """A job for AWS on a controller without AWS is told that AWS is not configured and where the setup is."""
    message = explain_unsatisfiable([GCP_T4], res(accelerators="T4:1", cloud=["aws"]))
    assert message.startswith("cloud aws is not configured: add it under clouds: in the controller's config.yaml")
    assert "docs/aws.md" in message and "; the cheapest offer that meets everything else is " in message
    assert "/h spot" in message and " at $" in message


def test_a_spot_job_with_no_spot_market_is_told_to_use_auto():
    """When only on-demand exists, the message suggests spot_policy auto or on-demand."""
    message = explain_unsatisfiable([offer(spot=None)], res(accelerators="T4:1"))
    assert message.startswith("spot_policy spot") and "auto" in message and "$0.526/h on-demand" in message


def test_two_constraints_together_are_both_named():
    """When no single constraint is to blame, the message names each that the closest offer fails."""
    assert explain_unsatisfiable(MARKET, res(accelerators="T4:1", cpus=64, memory_gb=64)) == (
        "no offer with accelerators T4:1 meets cpus 64 and memory_gb 64; the closest is g4dn.xlarge in "
        "us-east-1b at $0.19/h spot; relax one of them")


def test_no_offers_at_all_says_to_configure_a_cloud():
    """An empty market asks for a cloud in the config."""
    assert "config.yaml" in explain_unsatisfiable([], res())


# --- filter_offers ---------------------------------------------------------------------------------


def test_filter_lists_everything_cheapest_spot_first():
    """With no filter every offer is listed, ordered by spot price."""
    assert [o.spot_price for o in filter_offers(MARKET)] == [0.037, 0.19, 0.20, 0.215, 0.22, 2.47]


def test_filter_by_accelerator_and_cloud_in_on_demand_order():
    """--accelerators t4:1 --cloud gcp --on-demand keeps the GCP T4 offers, by on-demand price."""
    assert filter_offers(MARKET, accelerators="t4:1", cloud="gcp", on_demand=True) == [GCP_T4]
    assert filter_offers(MARKET, accelerators="T4", cloud="aws") == [T4_B, T4_A, T4_C]
    assert filter_offers(MARKET, accelerators="T4:8") == []


def test_filter_puts_offers_without_spot_market_last():
    """An offer with no spot price follows those with one when listing by spot price."""
    no_spot = offer("us-east-1d", spot=None, od=0.1)
    assert filter_offers([no_spot, T4_A])[-1] == no_spot


def test_filter_rejects_a_malformed_accelerator():
    """A malformed --accelerators value raises ValueError naming the format."""
    with pytest.raises(ValueError, match="NAME:COUNT"):
        filter_offers(MARKET, accelerators="T4:zero")


def test_the_policys_public_api_is_pinned():
    """The names other modules use are there, with Candidate as (offer, spot, price)."""
    import runner.scheduler.policy as policy

    for name in ("fits", "rank_offers", "filter_offers", "explain_unsatisfiable", "BackoffBook", "Candidate",
                 "CONSTRAINTS"):
        assert hasattr(policy, name), name
    assert Candidate._fields == ("offer", "spot", "price")
    assert policy.CONSTRAINTS[:5] == ("accelerators", "cpus", "memory_gb", "cloud", "regions")


def test_a_spot_stockout_does_not_block_the_on_demand_fallback():
    """With every spot launch backed off, auto's fallback still offers on-demand in the same zones."""
    spot_book, on_demand_book = BackoffBook(), BackoffBook()
    for o in (T4_A, T4_B, T4_C):
        spot_book.record_failure((o.cloud, o.zone, o.instance_type), now=0)
    resources = Resources(accelerators="T4:1", cloud=["aws"], spot_policy="auto")
    ranked = rank_offers(MARKET, resources, backoff=spot_book, on_demand_backoff=on_demand_book, now=1,
                         on_demand_fallback=True)
    assert ranked and all(not c.spot for c in ranked)
    assert rank_offers(MARKET, resources, backoff=spot_book, on_demand_backoff=on_demand_book, now=1) == []


def test_auto_turns_to_on_demand_only_after_the_configured_wait():
    """choose() keeps a job on spot until it has waited on_demand_after seconds, then takes on-demand."""
    from runner.scheduler.placement import choose

    spot_book = BackoffBook()
    for o in (T4_A, T4_B, T4_C):
        spot_book.record_failure((o.cloud, o.zone, o.instance_type), now=0)
    resources = Resources(accelerators="T4:1", cloud=["aws"], spot_policy="auto")
    kwargs = dict(avoid_zones=set(), backoff=spot_book, on_demand_backoff=BackoffBook(), waiting_since=0,
                  on_demand_after=5)
    assert choose(MARKET, resources, now=4, **kwargs) is None
    offer, spot = choose(MARKET, resources, now=6, **kwargs)
    assert spot is False and offer.accelerator == "T4"
