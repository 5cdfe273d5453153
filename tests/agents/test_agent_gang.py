"""The agent's part in a gang, without processes: registration that waits, the job's variables, peer stops."""

from __future__ import annotations

import threading

from agents.gang import GangRanks, node_address, register_for_attempt
from runner.protocol.environment import gang_environment

ASSIGNMENT = {"job_id": "j", "attempt": 3, "gang": {"num_nodes": 2, "node_rank": 1, "node_ips": ["10.0.0.1", "10.0.0.2"],
                                                  "master_addr": "10.0.0.1", "master_port": 29611, "gpus_per_node": 8}}


def test_registration_asks_again_while_the_controller_says_wait():
    """Two waiting replies, then the assignment: it is returned, and every call sent the node's address."""
    replies = iter([{"status": "waiting", "message": "ranks [1]", "retry_seconds": 0},
                    {"status": "waiting", "message": "ranks [1]", "retry_seconds": 0}, ASSIGNMENT])
    bodies = []

    def register(body):
        bodies.append(body)
        return next(replies)

    assert register_for_attempt(register, "10.0.0.2", threading.Event()) == ASSIGNMENT
    assert bodies == [{"address": "10.0.0.2"}] * 3


def test_a_refused_registration_ends_the_wait():
    """The controller refuses the node (its job ended): None."""
    assert register_for_attempt(lambda body: None, "10.0.0.2", threading.Event()) is None


def test_the_job_gets_the_gang_variables_with_addresses_one_per_line():
    """Every gang variable of docs/environment.md, from the assignment's gang."""
    assert gang_environment(ASSIGNMENT["gang"]) == {
        "RUNNER_NUM_NODES": "2", "RUNNER_NODE_RANK": "1", "RUNNER_NODE_IPS": "10.0.0.1\n10.0.0.2",
        "RUNNER_MASTER_ADDR": "10.0.0.1", "RUNNER_MASTER_PORT": "29611", "RUNNER_GPUS_PER_NODE": "8"}


def test_an_assignment_without_a_gang_adds_no_variables():
    """A controller that sends no gang: the job's environment is as before."""
    assert gang_environment({"job_id": "j", "attempt": 1}.get("gang")) == {}


def test_a_stop_learned_from_a_peer_is_reported_as_such_whatever_the_exit_code():
    """origin peer: succeeded and failed both become stopped-by-peer; a preemption stays a preemption."""
    ranks = GangRanks()
    assert ranks.on_stopping({"op": "stopping", "step": 7, "origin": "peer", "reason": "notice"})
    assert ranks.exit_reason("succeeded") == ranks.exit_reason("failed") == "stopped-by-peer"
    assert ranks.exit_reason("preempted") == "preempted"


def test_a_stop_of_this_nodes_own_is_not_a_peers():
    """origin self (or a library that sends no origin): the exit is reported as it is."""
    ranks = GangRanks()
    assert not ranks.on_stopping({"op": "stopping", "step": 7, "origin": "self"})
    assert not ranks.on_stopping({"op": "stopping", "step": 7})
    assert ranks.exit_reason("succeeded") == "succeeded"


def test_the_drill_verdict_lists_every_local_rank_and_fails_on_a_different_step():
    """Ranks 2 and 3 restored 40 and 38 of an expected 40: the verdict fails, naming rank 3."""
    ranks = GangRanks()
    ranks.on_restored({"op": "restored", "step": 40, "rank": 2})
    ranks.on_restored({"op": "restored", "step": 38, "rank": 3})
    verdict = ranks.drill_verdict({"passed": True, "resumed_step": 40, "checkpoint_step": 40}, expected=40)
    assert verdict["ranks"] == {"2": 40, "3": 38} and verdict["passed"] is False
    assert "rank 3 restored 38 instead of 40" in verdict["message"]


def test_a_configured_address_wins_and_otherwise_the_route_to_the_controller_decides():
    """address in the agent config is used as is; without it, the loopback controller gives 127.0.0.1."""
    assert node_address("10.1.2.3", "http://10.0.0.9:8470") == "10.1.2.3"
    assert node_address(None, "http://127.0.0.1:8470") == "127.0.0.1"


def test_waiting_for_the_local_ranks_restores_ends_when_each_has_reported():
    """Two ranks: the wait ends once the second reports, from another thread."""
    ranks = GangRanks()
    ranks.on_restored({"op": "restored", "step": 5, "rank": 0})
    later = threading.Thread(target=ranks.on_restored, args=({"op": "restored", "step": 5, "rank": 1},))
    later.start()
    assert ranks.wait_restored(2, timeout=60)
    later.join()
    assert not GangRanks().wait_restored(1, timeout=0.01)


class _Exited:
    """A training process that has already exited (it stopped with its gang)."""

    def running(self) -> bool:
        return False

    def unreachable(self) -> None:
        pass

    def finish(self, own_exit: float, after_sigterm: float) -> None:
        pass

    def done_training(self) -> bool:
        return False


def test_a_node_whose_notice_came_after_its_gang_stopped_says_the_checkpoint_was_taken():
    """Both nodes preempted, node 0's notice first: node 1's ranks stop with the gang (a peer's stop, step 40,
    durable) and have exited when node 1's own notice asks them; nothing answers it. The restart log's line
    says the emergency checkpoint of step 40 was taken, not that the job did not acknowledge one."""
    from agents.emergency import EmergencyStop
    from agents.watchers import Notice

    ranks = GangRanks()
    assert ranks.on_stopping({"op": "stopping", "step": 40, "durable": True, "reason": "notice", "origin": "peer"})
    emergency = EmergencyStop(send=lambda message: 0, trainee=_Exited())
    emergency.start(Notice.create("aws", "termination", "terminate", terminal=True, grace=5))
    assert emergency.finished.wait(60)
    line = ranks.preempted_summary(emergency.ack, emergency.summary())
    assert "did not acknowledge" not in line
    assert line.startswith("preempted: emergency checkpoint at step 40, durable")


def test_a_node_preempted_alone_keeps_its_own_line():
    """No peer stop: the node's own summary stands (acknowledged or not)."""
    ranks = GangRanks()
    assert ranks.preempted_summary(None, "preempted: the job did not acknowledge") == \
        "preempted: the job did not acknowledge"
    ranks.on_stopping({"op": "stopping", "step": 40, "durable": True, "origin": "peer"})
    own = {"op": "stopping", "step": 41, "durable": True}
    assert ranks.preempted_summary(own, "preempted: emergency checkpoint at step 41, durable") == \
        "preempted: emergency checkpoint at step 41, durable"


def test_peers_that_exited_leave_this_nodes_success_a_success_and_are_forgotten_at_the_next_attempt():
    """``peers-exited`` only lets the launcher end: unlike a stop for a peer it turns no exit into stopped-by-peer."""
    ranks = GangRanks()
    ranks.on_peers_exited()
    assert ranks.peers_exited and ranks.exit_reason("succeeded") == "succeeded"
    ranks.reset()
    assert not ranks.peers_exited
