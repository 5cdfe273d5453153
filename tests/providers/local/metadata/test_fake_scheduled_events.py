"""The fake Azure Scheduled Events endpoint answers as IMDS does."""

import email.utils
from metadata_fixtures import azure, http  # noqa: F401 - pytest fixtures

EVENTS = "/metadata/scheduledevents"
VERSION = {"api-version": "2020-07-01"}
HEADER = {"Metadata": "true"}


def events(azure, http):
    response = http.get(azure.url + EVENTS, params=VERSION, headers=HEADER, timeout=30)
    assert response.status_code == 200
    return response.json()


def test_requests_without_metadata_header_are_400(azure, http):
    """Without Metadata: true the answer is 400 naming the missing header."""
    response = http.get(azure.url + EVENTS, params=VERSION, timeout=30)
    assert response.status_code == 400 and "metadata header" in response.json()["error"]


def test_requests_without_api_version_are_400(azure, http):
    """Without api-version the answer is 400."""
    response = http.get(azure.url + EVENTS, headers=HEADER, timeout=30)
    assert response.status_code == 400 and "api-version" in response.json()["error"]


def test_no_events_is_an_empty_list(azure, http):
    """With nothing scheduled, Events is empty and DocumentIncarnation is a number."""
    document = events(azure, http)
    assert document["Events"] == [] and isinstance(document["DocumentIncarnation"], int)


def test_preempt_posts_a_preempt_event_with_rfc1123_not_before(azure, http):
    """preempt() schedules a Preempt event whose NotBefore is RFC 1123, deadline seconds ahead."""
    before = events(azure, http)["DocumentIncarnation"]
    azure.preempt(30)
    document = events(azure, http)
    event = document["Events"][0]
    assert document["DocumentIncarnation"] > before
    assert event["EventType"] == "Preempt" and event["EventStatus"] == "Scheduled"
    assert event["NotBefore"].endswith(" GMT") and email.utils.parsedate_to_datetime(event["NotBefore"])


def test_start_requests_acknowledge_an_event(azure, http):
    """POSTing StartRequests acknowledges the event, which then shows as Started."""
    event_id = azure.add_event("Preempt")
    response = http.post(azure.url + EVENTS, params=VERSION, headers=HEADER, timeout=2,
                         json={"StartRequests": [{"EventId": event_id}]})
    assert response.status_code == 200 and azure.acknowledged == [event_id]
    assert events(azure, http)["Events"][0]["EventStatus"] == "Started"


def test_malformed_start_requests_are_400(azure, http):
    """A POST body that is not StartRequests is refused with 400."""
    response = http.post(azure.url + EVENTS, params=VERSION, headers=HEADER, data=b"{", timeout=30)
    assert response.status_code == 400


def test_instance_document_identifies_azure(azure, http):
    """GET /metadata/instance answers a compute document (how a node recognises Azure)."""
    response = http.get(azure.url + "/metadata/instance", params={"api-version": "2021-02-01"}, headers=HEADER,
                        timeout=30)
    assert response.json()["compute"]["azEnvironment"] == "AzurePublicCloud"
