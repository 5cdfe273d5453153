"""The read behind the move to spot, on both databases: which running attempts are on on-demand, and since
when a move was asked of them."""

from __future__ import annotations

from runner.providers.memory import memory_offers
from runner.state import Store, open_database
from runner.state.spot_moves import OnDemandAttempt, on_demand_attempts
from stored import job_spec

OFFER = memory_offers(("zone-a",))[0]


def test_only_registered_on_demand_attempts_of_running_uncancelled_jobs_with_their_move_request(db_url):
    store = Store(open_database(db_url))
    with store.db.transaction() as tx:
        for job_id, state, spot, registered, created in [
                ("on-demand", "RUNNING", False, True, 1.0), ("moving", "RUNNING", False, True, 2.0),
                ("on-spot", "RUNNING", True, True, 3.0), ("booting", "PROVISIONING", False, False, 4.0),
                ("cancelled", "RUNNING", False, True, 5.0)]:
            store.insert_job(tx, job_id, job_id, job_spec(job_id), state, created)
            attempt = store.insert_attempt(tx, job_id, f"n-{job_id}", OFFER, spot, 0, created)
            if registered:
                store.mark_attempt_running(tx, job_id, attempt, created + 1)
        store.request_cancel(tx, "cancelled", 10.0)
        store.add_event(tx, "moving", "move", "moved to spot: ...", attempt=1, now=20.5)
        store.add_event(tx, "moving", "placement", "on-demand: ...", attempt=1, now=21.0)
        store.add_event(tx, "on-demand", "move", "an earlier attempt's request", attempt=0, now=15.0)

    assert on_demand_attempts(store.db, "RUNNING", "move") == [
        OnDemandAttempt("on-demand", 1, None), OnDemandAttempt("moving", 1, 20.5)]
