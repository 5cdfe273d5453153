"""The fake IMDS answers as EC2's does, to botocore's own client and to raw requests."""

import json
import re
import time

import botocore.session
import pytest
import requests
from botocore.exceptions import MetadataRetrievalError
from botocore.utils import IMDSFetcher, InstanceMetadataFetcher, InstanceMetadataRegionFetcher
from metadata_fixtures import imds, http  # noqa: F401 - pytest fixtures

TTL = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN = "X-aws-ec2-metadata-token"
PATIENCE = 30  # seconds: a bound on a local answer on a busy machine, never an expected duration


def token(http, imds, ttl="60"):
    response = http.put(imds.url + "/latest/api/token", headers={TTL: ttl}, timeout=PATIENCE)
    assert response.status_code == 200
    return response.text


def get(http, imds, path, tok=None):
    return http.get(imds.url + path, headers={TOKEN: tok} if tok else {}, timeout=PATIENCE)


def botocore_config(monkeypatch, imds):
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint)
    endpoint = botocore.session.Session().get_config_variable("ec2_metadata_service_endpoint")
    return {"ec2_metadata_service_endpoint": endpoint}


def test_botocore_finds_region_through_the_endpoint_variable(imds, monkeypatch):
    """botocore's region fetcher, pointed by AWS_EC2_METADATA_SERVICE_ENDPOINT, reads the fake's zone."""
    assert InstanceMetadataRegionFetcher(config=botocore_config(monkeypatch, imds)).retrieve_region() == "us-east-1"


def test_botocore_reads_instance_role_credentials(imds, monkeypatch):
    """botocore's credential fetcher gets the role's temporary credentials over IMDSv2."""
    creds = InstanceMetadataFetcher(config=botocore_config(monkeypatch, imds)).retrieve_iam_role_credentials()
    assert creds["role_name"] == "runner-node" and creds["access_key"].startswith("ASIA")


def test_botocore_sees_404_for_an_absent_notice(imds, monkeypatch):
    """With no notice pending, spot/instance-action is a 404 to botocore too."""
    fetcher = IMDSFetcher(config=botocore_config(monkeypatch, imds))
    response = fetcher._get_request("latest/meta-data/spot/instance-action", lambda r: False,
                                    token=fetcher._fetch_metadata_token())
    assert response.status_code == 404


def test_botocore_gets_401_with_an_expired_token(imds, monkeypatch):
    """A token that has expired is refused with 401."""
    fetcher = IMDSFetcher(config=botocore_config(monkeypatch, imds))
    tok = fetcher._fetch_metadata_token()
    imds.expire_tokens()
    assert fetcher._get_request("latest/meta-data/instance-id", lambda r: False, token=tok).status_code == 401


def test_botocore_falls_back_to_imdsv1_when_the_put_is_dropped(monkeypatch):
    """A dropped token PUT times out in botocore, which then reads without a token where IMDSv1 is allowed."""
    from runner.providers.local.metadata import FakeIMDS

    with FakeIMDS(require_token=False) as imds:
        imds.add_fault("drop", method="PUT")
        fetcher = InstanceMetadataRegionFetcher(timeout=0.3, config=botocore_config(monkeypatch, imds))
        assert fetcher.retrieve_region() == "us-east-1"


def test_botocore_gives_up_when_put_dropped_and_v1_disabled(imds, monkeypatch):
    """With the PUT dropped and IMDSv1 disabled client-side, botocore cannot read metadata."""
    imds.add_fault("drop", method="PUT")
    config = {**botocore_config(monkeypatch, imds), "ec2_metadata_v1_disabled": True}
    with pytest.raises(MetadataRetrievalError):
        InstanceMetadataRegionFetcher(timeout=0.3, config=config).retrieve_region()


@pytest.mark.parametrize("ttl", [None, "0", "21601", "abc"])
def test_token_put_needs_a_ttl_between_1_and_21600(imds, http, ttl):
    """A token PUT with a missing or out-of-range TTL is a 400."""
    headers = {} if ttl is None else {TTL: ttl}
    assert http.put(imds.url + "/latest/api/token", headers=headers, timeout=PATIENCE).status_code == 400


def test_token_put_through_a_proxy_is_forbidden(imds, http):
    """A token PUT carrying X-Forwarded-For is refused with 403."""
    headers = {TTL: "60", "X-Forwarded-For": "10.0.0.9"}
    assert http.put(imds.url + "/latest/api/token", headers=headers, timeout=PATIENCE).status_code == 403


def test_token_put_to_a_versioned_path_is_forbidden(imds, http):
    """Tokens come only from /latest/api/token; a versioned token path is a 403."""
    assert http.put(imds.url + "/2021-01-03/api/token", headers={TTL: "60"}, timeout=PATIENCE).status_code == 403


def test_get_without_token_is_401_when_imdsv2_is_required(imds, http):
    """IMDSv2 required: a GET without a token is a 401."""
    assert get(http, imds, "/latest/meta-data/instance-id").status_code == 401


def test_get_without_token_works_when_imdsv1_is_allowed(http):
    """With IMDSv1 allowed, a GET without a token is answered."""
    from runner.providers.local.metadata import FakeIMDS

    with FakeIMDS(require_token=False) as imds:
        assert get(http, imds, "/latest/meta-data/instance-id").text == imds.instance_id


def test_token_expires_after_its_ttl(imds, http):
    """A token stops working once its TTL has passed."""
    tok = token(http, imds, ttl="1")
    assert get(http, imds, "/latest/meta-data/instance-id", tok).status_code == 200
    time.sleep(1.1)
    assert get(http, imds, "/latest/meta-data/instance-id", tok).status_code == 401


def test_absent_items_are_404(imds, http):
    """Items that are not present (no notice yet) are 404, the normal 'nothing pending' answer."""
    tok = token(http, imds)
    for path in ("spot/instance-action", "events/recommendations/rebalance", "events/maintenance/scheduled"):
        assert get(http, imds, "/latest/meta-data/" + path, tok).status_code == 404


def test_spot_notice_has_action_and_iso_time(imds, http):
    """A spot notice is JSON with the action and an ISO-8601 UTC time."""
    imds.set_instance_action("stop", deadline_seconds=120)
    body = get(http, imds, "/latest/meta-data/spot/instance-action", token(http, imds)).json()
    assert body["action"] == "stop" and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", body["time"])


def test_preempt_gives_rebalance_and_terminate(imds, http):
    """preempt() posts a rebalance recommendation and a terminate instance-action."""
    imds.preempt(120)
    tok = token(http, imds)
    assert get(http, imds, "/latest/meta-data/spot/instance-action", tok).json()["action"] == "terminate"
    assert "noticeTime" in get(http, imds, "/latest/meta-data/events/recommendations/rebalance", tok).json()


def test_recompute_time_changes_time_on_every_request(http):
    """Like the official mock, recompute_time makes the notice's time move with each request."""
    from runner.providers.local.metadata import FakeIMDS

    with FakeIMDS(recompute_time=True) as imds:
        imds.set_instance_action("terminate", 120)
        tok = token(http, imds)
        first = get(http, imds, "/latest/meta-data/spot/instance-action", tok).json()["time"]
        time.sleep(1.05)
        assert get(http, imds, "/latest/meta-data/spot/instance-action", tok).json()["time"] != first


def test_scheduled_events_use_the_aws_date_format(imds, http):
    """Scheduled events carry NotBefore like '21 Jan 2019 09:00:43 GMT' and their State."""
    imds.add_scheduled_event("instance-retirement", state="active")
    events = get(http, imds, "/latest/meta-data/events/maintenance/scheduled", token(http, imds)).json()
    assert events[0]["Code"] == "instance-retirement" and events[0]["State"] == "active"
    assert re.fullmatch(r"\d{1,2} [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT", events[0]["NotBefore"])


def test_disabled_imds_is_403_everywhere(imds, http):
    """IMDS turned off: the token PUT and every GET are 403."""
    imds.set_disabled()
    assert http.put(imds.url + "/latest/api/token", headers={TTL: "60"}, timeout=PATIENCE).status_code == 403
    assert get(http, imds, "/latest/meta-data/instance-id").status_code == 403


def test_status_fault_applies_to_the_next_n_requests(imds, http):
    """A status fault answers the next `count` matching requests with that status, then stops."""
    imds.add_fault("status", status=503, count=2, path="/latest/meta-data/")
    tok = token(http, imds)
    codes = [get(http, imds, "/latest/meta-data/instance-id", tok).status_code for _ in range(3)]
    assert codes == [503, 503, 200]


def test_garbage_fault_answers_200_with_no_valid_json(imds, http):
    """A garbage fault answers 200 with a body that is not a notice."""
    imds.add_fault("garbage", count=1)
    response = get(http, imds, "/latest/meta-data/spot/instance-action")
    assert response.status_code == 200
    with pytest.raises(ValueError):
        json.loads(response.content)


def test_slow_fault_delays_the_answer(imds, http):
    """A slow fault answers normally, late."""
    imds.add_fault("slow", delay=0.4, count=1)
    start = time.monotonic()
    assert get(http, imds, "/latest/meta-data/instance-id").status_code == 401
    assert time.monotonic() - start >= 0.4


def test_drop_fault_never_answers(imds, http):
    """A dropped request times out at the client; nothing comes back."""
    imds.add_fault("drop", method="PUT")
    with pytest.raises(requests.ReadTimeout):
        http.put(imds.url + "/latest/api/token", headers={TTL: "60"}, timeout=(1, 0.3))


def test_requests_are_counted_but_admin_calls_are_not(imds, http):
    """stats() counts protocol requests by path; /_fake/ calls are not counted."""
    token(http, imds)
    get(http, imds, "/latest/meta-data/instance-id")
    http.get(imds.url + "/_fake/stats", timeout=PATIENCE)
    assert imds.stats() == {"requests": 2, "by_path": {"/latest/api/token": 1, "/latest/meta-data/instance-id": 1}}


def test_stop_cuts_open_connections(imds, http):
    """After stop(), even a kept-alive connection gets no answer, as when the server dies."""
    token(http, imds)
    imds.stop()
    with pytest.raises(requests.ConnectionError):
        get(http, imds, "/latest/meta-data/instance-id")


def test_restart_serves_on_the_same_port(imds, http):
    """A stopped fake started again listens on the same port, so clients find it again."""
    port = imds.port
    imds.stop()
    imds.start()
    assert imds.port == port and token(http, imds)
