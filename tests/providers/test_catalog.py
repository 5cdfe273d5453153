"""The offer catalog shipped as data, and the simulated local market drawn from it."""

from __future__ import annotations

import re

import pytest

from runner.providers.catalog import (
    CatalogError,
    canonical_accelerator,
    catalog_date,
    catalog_meta,
    known_accelerators,
    load_catalog,
    local_offers,
    zone_factor,
)

ZONES = ["local-a", "local-b", "local-c"]


def test_catalog_loads_offers_of_aws_and_gcp():
    """The shipped catalog holds GPU and CPU offers of both AWS and GCP."""
    offers = load_catalog()
    assert {o.cloud for o in offers} == {"aws", "gcp"}
    assert any(o.accelerator is None for o in offers)
    assert len(offers) > 50


def test_every_row_is_sane():
    """Every row has positive resources, a spot price above 0, and an on-demand price at least as high."""
    for o in load_catalog():
        assert o.cpus >= 1 and o.memory_gb > 0, o
        assert o.spot_price is not None and 0 < o.spot_price <= o.on_demand_price, o
        assert (o.accelerator is None) == (o.accelerator_count == 0), o
        assert o.zone.startswith(o.region), o


def test_catalog_is_dated_and_says_its_prices_are_approximate():
    """The catalog has a date and its meta names sources and says the prices are approximate."""
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", catalog_date())
    meta = catalog_meta()
    assert meta["sources"] and "approximate" in meta["note"].lower()


def test_known_accelerators_include_the_six_named_gpus():
    """T4, L4, A10G, L40S, A100 and H100 are all in the catalog."""
    assert {"T4", "L4", "A10G", "L40S", "A100", "H100"} <= set(known_accelerators())


def test_the_expected_families_and_zones_are_present():
    """AWS offers the g4dn, g5, g6, g6e, p4d and p5 families in several zones; GCP its GPU machine families."""
    offers = load_catalog()
    aws_families = {o.instance_type.split(".")[0] for o in offers if o.cloud == "aws"}
    assert {"g4dn", "g5", "g6", "g6e", "p4d", "p5"} <= aws_families
    assert {"us-east-1a", "us-east-1b", "us-east-1c", "us-west-2a", "us-west-2b"} <= {o.zone for o in offers}
    gcp_families = {o.instance_type.split("-")[0] for o in offers if o.cloud == "gcp"}
    assert {"n1", "g2", "a2", "a3"} <= gcp_families
    assert {"us-central1-a", "us-central1-b", "us-central1-c", "europe-west4-a"} <= {o.zone for o in offers}


def test_field_notes_sample_prices_are_kept():
    """The sample list prices (g4dn.xlarge 0.526/0.20, p5.48xlarge 55.04/11.99) appear in us-east-1a."""
    rows = {o.instance_type: o for o in load_catalog() if o.zone == "us-east-1a"}
    assert (rows["g4dn.xlarge"].on_demand_price, rows["g4dn.xlarge"].spot_price) == (0.526, 0.20)
    assert (rows["p5.48xlarge"].accelerator, rows["p5.48xlarge"].accelerator_count) == ("H100", 8)
    assert (rows["p5.48xlarge"].on_demand_price, rows["p5.48xlarge"].spot_price) == (55.04, 11.99)


def test_accelerator_names_match_case_insensitively():
    """'a100' and 'l40s' are spelled as the catalog spells them; an unknown name gives None."""
    assert canonical_accelerator("a100") == "A100"
    assert canonical_accelerator("l40s") == "L40S"
    assert canonical_accelerator("X100") is None


def test_a_catalog_file_can_be_given_with_comments_and_no_spot_market(tmp_path):
    """A CSV path loads; '#' lines are comments and an empty spot price means no spot market."""
    path = tmp_path / "mine.csv"
    path.write_text("# as of 2027-01-31\n"
                    "cloud,region,zone,instance_type,accelerator,accelerator_count,cpus,memory_gb,on_demand_price,spot_price\n"
                    "aws,us-east-1,us-east-1a,m5.large,,0,2,8,0.096,\n")
    [offer] = load_catalog(path)
    assert offer.spot_price is None and offer.accelerator is None
    assert catalog_date(path) == "2027-01-31"


def test_a_malformed_row_names_the_row_and_column(tmp_path):
    """A price that is not a number is rejected with the row and column named."""
    path = tmp_path / "bad.csv"
    path.write_text("cloud,region,zone,instance_type,accelerator,accelerator_count,cpus,memory_gb,on_demand_price,spot_price\n"
                    "aws,us-east-1,us-east-1a,m5.large,,0,2,8,cheap,0.03\n")
    with pytest.raises(CatalogError, match=r"bad.csv row 1: on_demand_price 'cheap'"):
        load_catalog(path)


def test_a_missing_catalog_says_which_file(tmp_path):
    """A catalog path that does not exist gives an error naming it."""
    with pytest.raises(CatalogError, match="nope.csv"):
        load_catalog(tmp_path / "nope.csv")


def test_local_market_offers_every_type_in_every_zone():
    """Each simulated zone offers the same simulated types."""
    offers = local_offers(ZONES)
    by_zone = {zone: {o.instance_type for o in offers if o.zone == zone} for zone in ZONES}
    assert by_zone["local-a"] and by_zone["local-a"] == by_zone["local-b"] == by_zone["local-c"]
    assert {(o.cloud, o.region) for o in offers} == {("local", "local")}


def test_local_market_has_the_catalogs_gpu_names_and_prices():
    """The local market offers every catalog GPU under a sim- name, with the catalog's on-demand price."""
    offers = local_offers(["local-a"])
    assert {o.accelerator for o in offers if o.accelerator} == set(known_accelerators())
    types = {o.instance_type: o for o in offers}
    assert {"sim-t4", "sim-l4", "sim-a100-8", "sim-h100-8", "sim-cpu-4"} <= set(types)
    assert types["sim-t4"].on_demand_price == 0.526  # g4dn.xlarge, the cheapest T4:1 node
    assert (types["sim-a100-8"].accelerator, types["sim-a100-8"].accelerator_count) == ("A100", 8)


def test_local_zones_differ_in_spot_price_by_a_small_deterministic_spread():
    """Spot prices differ between zones by at most 8 %, and the same zone always gets the same price."""
    a, b = (sorted(local_offers([zone]), key=lambda o: o.instance_type) for zone in ("local-a", "local-b"))
    assert [o.spot_price for o in a] != [o.spot_price for o in b]
    assert local_offers(["local-a"]) == local_offers(["local-a"])
    for zone in ZONES + ["zone-x", "local-z"]:
        assert 0.92 <= zone_factor(zone) <= 1.08
    for o in local_offers(ZONES):
        assert 0 < o.spot_price <= o.on_demand_price


def test_a_zones_price_does_not_depend_on_the_other_zones():
    """Adding or reordering zones leaves each zone's prices as they were."""
    alone = local_offers(["local-b"])
    among = [o for o in local_offers(["local-c", "local-b", "local-a"]) if o.zone == "local-b"]
    assert alone == among


def test_the_public_api_is_pinned():
    """The catalog package exports exactly these names."""
    import runner.providers.catalog as catalog

    assert sorted(catalog.__all__) == ["CatalogError", "canonical_accelerator", "catalog_date", "catalog_meta",
                                       "known_accelerators", "load_catalog", "local_offers", "relative_throughput",
                                       "zone_factor"]
