"""The fake GCE metadata server answers as Compute Engine's does, to google-auth and to hanging GETs."""

import os
import subprocess
import sys
import threading
import time

import pytest
from google.auth import exceptions
from google.auth.compute_engine import _metadata
from google.auth.transport.requests import Request
from metadata_fixtures import gce, http  # noqa: F401 - pytest fixtures

FLAVOR = {"Metadata-Flavor": "Google"}


def url(gce, key=""):
    return f"http://{gce.endpoint}/computeMetadata/v1/{key}"


def root(gce):
    return url(gce)


def test_endpoint_is_host_and_port_without_scheme(gce):
    """GCE_METADATA_HOST takes host:port, so the fake's endpoint has no scheme."""
    assert gce.endpoint == f"127.0.0.1:{gce.port}"


def test_google_auth_ping_and_get_through_the_endpoint_variables(gce):
    """google-auth, configured only by GCE_METADATA_HOST/GCE_METADATA_IP, pings and reads the fake."""
    code = ("from google.auth.compute_engine import _metadata as m; from google.auth.transport.requests import Request;"
            "r = Request(); print(m.ping(r), m.get(r, 'project/project-id'), m.get(r, 'instance/preempted'))")
    env = {**os.environ, "GCE_METADATA_HOST": gce.endpoint, "GCE_METADATA_IP": gce.endpoint}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert result.stdout.split() == ["True", "runner-local", "FALSE"], result.stderr


def test_google_auth_reads_a_recursive_directory_as_json(gce):
    """A recursive directory read comes back as JSON, which google-auth decodes."""
    info = _metadata.get(Request(), "instance/service-accounts/default/", root=root(gce), recursive=True)
    assert info["email"].endswith(".iam.gserviceaccount.com")


def test_google_auth_sees_404_for_a_missing_key(gce):
    """A key that does not exist is a 404 (None to google-auth when it asks for that)."""
    assert _metadata.get(Request(), "instance/nothing-here", root=root(gce),
                         return_none_for_not_found_error=True) is None


def test_google_auth_retries_through_a_503(gce):
    """A brief 503, as during maintenance, is retried by google-auth and then answered."""
    gce.add_fault("status", status=503, count=1)
    assert _metadata.get(Request(), "instance/id", root=root(gce), retry_count=3) == "4520031799277581759"


def test_google_auth_gives_up_on_persistent_503(gce):
    """When every answer is a 503, google-auth raises a TransportError."""
    gce.add_fault("status", status=503)
    with pytest.raises(exceptions.TransportError):
        _metadata.get(Request(), "instance/id", root=root(gce), retry_count=1)


def test_requests_without_metadata_flavor_are_403(gce, http):
    """Every request needs Metadata-Flavor: Google; without it the answer is 403."""
    assert http.get(url(gce, "instance/preempted"), timeout=30).status_code == 403


def test_answers_carry_metadata_flavor_and_etag(gce, http):
    """Every answer carries Metadata-Flavor: Google and an ETag."""
    response = http.get(url(gce, "instance/preempted"), headers=FLAVOR, timeout=30)
    assert response.text == "FALSE"
    assert response.headers["Metadata-Flavor"] == "Google" and response.headers["ETag"]


def test_preempt_turns_preempted_true_and_changes_the_etag(gce, http):
    """preempt() sets instance/preempted to TRUE under a new ETag."""
    before = http.get(url(gce, "instance/preempted"), headers=FLAVOR, timeout=30).headers["ETag"]
    gce.preempt(30)
    after = http.get(url(gce, "instance/preempted"), headers=FLAVOR, timeout=30)
    assert after.text == "TRUE" and after.headers["ETag"] != before


def test_maintenance_event_takes_only_known_values(gce, http):
    """maintenance-event moves between NONE, MIGRATE_ and TERMINATE_ON_HOST_MAINTENANCE only."""
    gce.set_maintenance_event("MIGRATE_ON_HOST_MAINTENANCE")
    assert http.get(url(gce, "instance/maintenance-event"), headers=FLAVOR, timeout=30).text == \
        "MIGRATE_ON_HOST_MAINTENANCE"
    with pytest.raises(ValueError):
        gce.set_maintenance_event("SOMETIMES")


def test_hanging_get_with_stale_etag_returns_at_once(gce, http):
    """A hanging GET whose last_etag is already stale returns the new value at once."""
    stale = gce.etag("instance/preempted")
    gce.set_preempted(True)
    start = time.monotonic()
    response = http.get(url(gce, "instance/preempted"), headers=FLAVOR, timeout=90,
                        params={"wait_for_change": "true", "timeout_sec": "60", "last_etag": stale})
    # At once: long before the 60 s the server would otherwise hold it (no bound tighter than that, so that a
    # busy machine cannot fail it).
    assert response.text == "TRUE" and time.monotonic() - start < 30


def test_hanging_get_returns_when_the_value_changes(gce, http):
    """A hanging GET with the current etag blocks until the value changes."""
    current = gce.etag("instance/preempted")
    threading.Timer(0.3, gce.set_preempted).start()
    start = time.monotonic()
    response = http.get(url(gce, "instance/preempted"), headers=FLAVOR, timeout=90,
                        params={"wait_for_change": "true", "timeout_sec": "60", "last_etag": current})
    # Held until the change (not answered at once), and answered then, not at the end of its 60 s.
    assert response.text == "TRUE" and 0.25 < time.monotonic() - start < 30


def test_hanging_get_times_out_with_the_unchanged_value(gce, http):
    """Without a change, a hanging GET answers the unchanged value after timeout_sec."""
    current = gce.etag("instance/preempted")
    start = time.monotonic()
    response = http.get(url(gce, "instance/preempted"), headers=FLAVOR, timeout=5,
                        params={"wait_for_change": "true", "timeout_sec": "1", "last_etag": current})
    assert response.text == "FALSE" and response.headers["ETag"] == current
    assert time.monotonic() - start > 0.9  # held for its timeout_sec (the client gives up only at 5 s)


def test_stop_releases_hanging_gets(gce, http):
    """Stopping the server ends hanging GETs in flight instead of leaving them to time out."""
    result = {}

    def hang():
        try:
            http.get(url(gce, "instance/preempted"), headers=FLAVOR, timeout=90,
                     params={"wait_for_change": "true", "timeout_sec": "60"})
        except Exception as exc:  # noqa: BLE001 - any failure counts as released
            result["error"] = exc

    thread = threading.Thread(target=hang)
    thread.start()
    time.sleep(0.2)
    start = time.monotonic()
    gce.stop()
    thread.join(30)
    # Ended by the stop: long before the 60 s hold, or the client's 90 s, would have ended it.
    assert not thread.is_alive() and time.monotonic() - start < 30 and "error" in result
