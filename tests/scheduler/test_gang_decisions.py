"""Gang decisions as pure functions: placement and replacement, the attempt's outcome, each node's end."""

from __future__ import annotations

from runner.providers.offers import Offer
from runner.scheduler.gang import (
    KeptNode, gang_outcome, gpus_per_node, node_end_reasons, peers_exited, plan_gang, unregistered_ranks,
)
from runner.scheduler.policy import Candidate
from runner.state.rows import AttemptNode


def offer(zone: str, price: float, instance_type: str = "sim-t4") -> Offer:
    return Offer("local", "local", zone, instance_type, "T4", 1, 4, 16.0, price, price * 3)


def candidates(*offers: Offer) -> list[Candidate]:
    return [Candidate(o, True, o.spot_price) for o in offers]


A, B, C = offer("local-a", 0.10), offer("local-b", 0.12), offer("local-c", 0.20)


def slots(**free: int):
    return lambda o: free.get(o.zone.replace("local-", ""), 8)


def test_a_new_gang_goes_to_the_cheapest_zone_with_room_for_every_node():
    """Four nodes skip the cheaper zone that holds only three."""
    plan = plan_gang(4, [], candidates(A, B, C), slots(a=3))
    assert plan.candidate.offer == B and plan.launch == (0, 1, 2, 3) and not plan.keep and not plan.release


def test_no_zone_with_room_for_the_whole_gang_means_no_plan():
    """No zone takes all nodes at once: nothing is launched (all or none)."""
    assert plan_gang(3, [], candidates(A, B), slots(a=2, b=1)) is None


def test_a_lost_rank_is_replaced_in_the_kept_nodes_zone_even_if_another_is_cheaper():
    """Node 0 is kept in the dearer zone b; only rank 1 is launched, and in zone b."""
    kept = [KeptNode(0, "n-0", B, True)]
    plan = plan_gang(2, kept, candidates(A, B, C), slots(b=1))
    assert plan.candidate.offer == B and plan.launch == (1,) and set(plan.keep) == {0} and not plan.release


def test_the_whole_gang_moves_when_the_kept_zone_has_no_room_for_the_replacement():
    """Zone b is full: the kept node is released and every rank is launched in the cheapest other zone."""
    kept = [KeptNode(0, "n-0", B, True)]
    plan = plan_gang(2, kept, candidates(A, B, C), slots(b=0))
    assert plan.candidate.offer == A and plan.launch == (0, 1) and plan.release == ("n-0",) and not plan.keep


def test_the_replacement_prefers_the_kept_nodes_instance_type():
    """Of two types in the kept zone, the replacement takes the kept nodes' type though the other is cheaper."""
    cheaper_type = offer("local-b", 0.05, "sim-t4-big")
    kept = [KeptNode(1, "n-1", B, True)]
    plan = plan_gang(2, kept, candidates(cheaper_type, B), slots())
    assert plan.candidate.offer == B and plan.launch == (0,)


def test_a_gang_with_every_rank_kept_launches_nothing():
    """After a failure or a drill every node is kept: the plan keeps them all in their zone."""
    kept = [KeptNode(0, "n-0", A, True), KeptNode(1, "n-1", A, True)]
    plan = plan_gang(2, kept, candidates(B), slots())
    assert plan.launch == () and plan.candidate is None and plan.zone == "local-a"


def test_a_preemption_report_ends_the_attempt_at_once_with_its_rank():
    """Rank 1 preempted, rank 0 not reported yet: the attempt ends as preempted by rank 1."""
    outcome = gang_outcome({0: None, 1: "preempted"}, 2)
    assert outcome.reason == "preempted" and outcome.ranks == (1,)


def test_a_peer_stop_alone_waits_for_the_peers_report():
    """Rank 0 stopped for a peer, rank 1 has not reported: no decision yet."""
    assert gang_outcome({0: "stopped-by-peer"}, 2) is None


def test_a_preemption_explains_a_peers_failure():
    """One node preempted, another failed meanwhile: the attempt was preempted, not failed."""
    assert gang_outcome({0: "failed", 1: "preempted"}, 2).reason == "preempted"


def test_the_attempt_succeeds_only_when_every_node_exited_0():
    """One node's success waits for the others; all successes end the attempt succeeded."""
    assert gang_outcome({0: "succeeded"}, 2) is None
    assert gang_outcome({0: "succeeded", 1: "succeeded"}, 2).reason == "succeeded"


def test_a_stop_from_outside_with_no_preemption_is_a_failure_of_the_rank_that_stopped():
    """Rank 1 exited 0 on its own and rank 0 stopped for it: failed, blamed on rank 1."""
    outcome = gang_outcome({0: "stopped-by-peer", 1: "succeeded"}, 2)
    assert outcome.reason == "failed" and outcome.ranks == (1,)


def test_while_the_job_goes_on_the_preempted_node_ends_and_the_others_are_kept():
    """Rank 1 preempted: it ends preempted, ranks 0 and 2 are kept."""
    assert node_end_reasons(3, "preempted", [1], job_goes_on=True) == {0: "kept", 1: "preempted", 2: "kept"}


def test_a_failure_or_a_drill_keeps_every_node():
    """The job's own failure is no node's fault: every node carries on."""
    assert node_end_reasons(2, "failed", [0], job_goes_on=True) == {0: "kept", 1: "kept"}
    assert node_end_reasons(2, "drill", [0], job_goes_on=True) == {0: "kept", 1: "kept"}


def test_when_the_job_ends_every_node_ends_with_it():
    """Succeeded: every node succeeded; preemptions used up: the healthy nodes are released."""
    assert node_end_reasons(2, "succeeded", [], job_goes_on=False) == {0: "succeeded", 1: "succeeded"}
    assert node_end_reasons(2, "preempted", [0], job_goes_on=False) == {0: "preempted", 1: "released"}


def test_a_node_whose_part_was_done_is_never_blamed():
    """Rank 0 finished its part before rank 1 failed or was lost: kept while the job goes on (released where its node
    goes: on notice, or gone), released when the job ends; never the attempt's reason."""
    assert node_end_reasons(2, "failed", [1], job_goes_on=True, finished=[0]) == {0: "kept", 1: "kept"}
    assert node_end_reasons(2, "failed", [1], job_goes_on=True, finished=[0], going=[0]) == {0: "released", 1: "kept"}
    assert node_end_reasons(2, "failed", [1], job_goes_on=False, finished=[0]) == {0: "released", 1: "failed"}
    assert node_end_reasons(2, "lost", [1], job_goes_on=True, finished=[0], going=[0]) == {0: "released", 1: "lost"}
    assert node_end_reasons(2, "preempted", [0], job_goes_on=True, finished=[0], going=[0]) == {
        0: "released", 1: "kept"}
    assert node_end_reasons(2, "succeeded", [], job_goes_on=False, finished=[0, 1]) == {0: "succeeded",
                                                                                       1: "succeeded"}


def test_the_ranks_missing_at_the_end_of_the_wait_are_named():
    """Before the timeout nothing is missing; after it, the unregistered ranks are."""
    ranks = [AttemptNode(job_id="j", attempt=1, rank=rank, node_id=f"n{rank}", zone="z", instance_type="t", spot=True,
                         price_per_hour=0.1, address=None, registered_at=registered_at, exit_reason=None,
                         exit_code=None, end_reason="running") for rank, registered_at in ((0, 5.0), (1, None))]
    assert unregistered_ranks(ranks, started_at=0.0, now=59.0, timeout=60.0) == []
    assert unregistered_ranks(ranks, started_at=0.0, now=61.0, timeout=60.0) == [1]


def test_gpus_per_node_is_the_accelerator_count_or_1():
    """A8 nodes give 8, CPU-only nodes 1."""
    assert gpus_per_node(("A100", 8)) == 8 and gpus_per_node(None) == 1


def test_a_nodes_peers_have_exited_once_every_other_node_that_did_not_leave_has_reported():
    """Then no launcher of theirs may still reach a barrier this node's launcher waits at."""
    def rank(r: int, exit_reason: str | None = None, left_at: float | None = None) -> AttemptNode:
        return AttemptNode(job_id="j", attempt=1, rank=r, node_id=f"n{r}", zone="z", instance_type="t", spot=True,
                           price_per_hour=0.1, address=None, registered_at=1.0, exit_reason=exit_reason,
                           exit_code=None, end_reason="running", left_at=left_at)

    assert not peers_exited([rank(0), rank(1)], 0)
    assert peers_exited([rank(0), rank(1, "succeeded")], 0)
    assert not peers_exited([rank(0), rank(1, "succeeded"), rank(2)], 0)  # node 2's launcher may still come
    assert peers_exited([rank(0), rank(1, "succeeded"), rank(2, left_at=1.0)], 0)  # it left an elastic world
    assert not peers_exited([rank(0)], 0)  # a gang of one has no peers to wait for
