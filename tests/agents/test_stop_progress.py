"""The restart log's words for a stop that some local rank never reached."""

from agents.stop_progress import StopProgress


def _progress(*messages: dict) -> StopProgress:
    progress = StopProgress()
    for message in messages:
        progress.on_message(message)
    return progress


def test_a_rank_behind_the_others_is_named_as_the_one_that_never_reached_the_stop_step():
    progress = _progress({"op": "hello", "rank": 2}, {"op": "hello", "rank": 3},
                         {"op": "request_seen", "rank": 2, "step": 36, "in_step": True},
                         {"op": "request_seen", "rank": 3, "step": 34, "in_step": False})
    assert progress.laggards() == "rank 3 never reached the stop step (its last step was 34, rank 2 waited at step 36)"


def test_ranks_waiting_at_one_step_wait_for_another_node_and_a_silent_rank_is_named():
    waiting = _progress({"op": "hello", "rank": 0}, {"op": "hello", "rank": 1},
                        {"op": "request_seen", "rank": 0, "step": 36}, {"op": "request_seen", "rank": 1, "step": 36})
    assert waiting.laggards() == "ranks 0, 1 waited at step 36 for a rank of another node"
    silent = _progress({"op": "hello", "rank": 0}, {"op": "hello", "rank": 1},
                       {"op": "request_seen", "rank": 0, "step": 36})
    assert silent.laggards() == "rank 1 never answered the stop request; rank 0 waited at step 36 for a rank of another node"


def test_nothing_to_say_when_every_rank_stopped():
    progress = _progress({"op": "hello", "rank": 0}, {"op": "request_seen", "rank": 0, "step": 5},
                         {"op": "stopping", "rank": 0, "step": 6})
    assert progress.laggards() is None
    progress.reset()
    assert progress.laggards() is None


def test_the_training_is_over_once_every_local_rank_closed_after_its_last_step_none_stopping():
    """What lets a notice's stop spare a job that ended during the notice (agents/stop_with_checkpoint.py)."""
    hellos = ({"op": "hello", "rank": 2}, {"op": "hello", "rank": 3})
    assert not _progress().done_training()  # no rank yet
    assert not _progress(*hellos, {"op": "closed", "rank": 2, "error": False}).done_training()  # rank 3 trains on
    assert _progress(*hellos, {"op": "closed", "rank": 2, "error": False},
                     {"op": "closed", "rank": 3, "error": False}).done_training()
    # a rank that closed on an exception, or ranks that stopped for a request, did not end their training loop
    assert not _progress(*hellos, {"op": "closed", "rank": 2, "error": False},
                         {"op": "closed", "rank": 3, "error": True}).done_training()
    assert not _progress(*hellos, {"op": "stopping", "rank": 2, "step": 9}, {"op": "stopping", "rank": 3, "step": 9},
                         {"op": "closed", "rank": 2}, {"op": "closed", "rank": 3}).done_training()
