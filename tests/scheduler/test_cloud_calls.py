"""CloudCalls: calls keyed per node, never two of one kind out for a node, answers read once, a wake only for work."""

from __future__ import annotations

import threading

from runner.scheduler.cloud_calls import CloudCalls, DaemonThreadPool


def test_a_key_with_a_call_out_is_not_asked_again_until_its_answer_is_read():
    """While a node's call is out (answered or not), a second request for it is refused; once read, it is taken."""
    calls = CloudCalls()
    assert calls.request("n-1", lambda: "first", asked=1)
    assert not calls.request("n-1", lambda: "second")
    assert calls.in_flight("n-1") and calls.keys_in_flight() == {"n-1"}
    (answer,) = calls.answers()
    assert (answer.key, answer.value, answer.error, answer.asked) == ("n-1", "first", None, 1)
    assert calls.answers() == [] and not calls.in_flight("n-1")
    assert calls.request("n-1", lambda: "second")


def test_a_batch_call_answers_each_key_and_names_one_it_left_out():
    """One call for several keys: each key gets its own answer; a key the call did not answer gets an error."""
    calls = CloudCalls()
    calls.request("n-2", lambda: "alone")
    asked = calls.request_batch({"n-1": 1, "n-2": 2, "n-3": 3}, lambda keys: {key: key.upper() for key in keys[:1]})
    assert asked == ["n-1", "n-3"]  # n-2 has its own call out
    answers = {answer.key: answer for answer in calls.answers()}
    assert answers["n-1"].value == "N-1" and answers["n-1"].asked == 1
    assert answers["n-2"].value == "alone"
    assert isinstance(answers["n-3"].error, LookupError) and "n-3" in str(answers["n-3"].error)


def test_an_error_is_an_answer_too():
    """A call that raises answers with its error; the key is free again once read."""
    calls = CloudCalls()
    calls.request("n-1", lambda: 1 / 0)
    (answer,) = calls.answers()
    assert isinstance(answer.error, ZeroDivisionError) and answer.value is None


def test_only_answers_that_are_work_wake_the_reconciler():
    """``on_answer`` runs for an answer ``wakes`` accepts, not for one it does not."""
    woken = []
    calls = CloudCalls(on_answer=lambda: woken.append(True), wakes=lambda answer: answer.value == "gone")
    calls.request("n-1", lambda: "alive")
    assert woken == []
    calls.request_batch({"n-2": None, "n-3": None}, lambda keys: {"n-2": "alive", "n-3": "gone"})
    assert woken == [True]


def test_on_threads_a_held_call_leaves_the_others_free():
    """On the daemon's threads a call that never returns keeps its own key in flight, and no other."""
    gate, done = threading.Event(), threading.Event()
    calls = CloudCalls(DaemonThreadPool(2, "test"), on_answer=done.set)
    try:
        calls.request("held", gate.wait)
        calls.request("quick", lambda: "answered")
        assert done.wait(60)
        assert [answer.key for answer in calls.answers()] == ["quick"]
        assert calls.keys_in_flight() == {"held"}
    finally:
        gate.set()
        calls.shutdown()
