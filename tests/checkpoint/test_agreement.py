"""The stop agreement's one-word round: its encoding, and real gloo ranks reaching one decision."""

from __future__ import annotations

import os
import socket
import types
from contextlib import contextmanager

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from runner.checkpoint.agreement import REASONS, StepAgreement, Word
from runner.checkpoint.control import CheckpointRequest
from runner.checkpoint.errors import CheckpointError


def reduce_or(*words: int) -> int:
    out = 0
    for word in words:
        out |= word
    return out


@pytest.mark.parametrize("step", [0, 1, 41, 2**27 - 1, 2**27, 10**12 + 7])
def test_ranks_at_the_same_step_agree(step):
    word = reduce_or(*(Word.encode(step, False, rank == 1, 0) for rank in range(8)))
    assert Word.steps_agree(word)
    assert word & Word.SAVE and not word & Word.STOP
    assert word < 2**63  # fits a signed int64


@pytest.mark.parametrize("a,b", [(10, 11), (0, 1), (1000, 1064), (5, 2**25 + 5)])
def test_ranks_at_different_steps_are_caught(a, b):
    assert not Word.steps_agree(reduce_or(Word.encode(a, False, False, 0), Word.encode(b, False, False, 0)))


def test_the_strongest_reason_wins():
    for weaker in range(1, len(REASONS)):
        for stronger in range(weaker, len(REASONS)):
            word = reduce_or(Word.encode(7, False, False, weaker), Word.encode(7, True, False, stronger))
            assert Word.reason(word) == stronger
    assert Word.reason(Word.encode(7, False, True, 0)) == 0


def test_every_reason_keeps_to_its_bits():
    """Every reason fits below the step's bits: a word with the strongest reason still decodes its step."""
    for reason in range(len(REASONS)):
        for step in (0, 7, Word.STEP_MASK):
            word = Word.encode(step, True, True, reason)
            assert (Word.reason(word), Word.steps_agree(word)) == (reason, True)
            assert word < 1 << 63  # the sign bit stays clear


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _agreement_of_rank(rank: int, world: int, port: int):
    """A StepAgreement on the default group of a gloo world of ``world`` ranks, as rank ``rank``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield StepAgreement(types.SimpleNamespace(group=None))
    finally:
        dist.destroy_process_group()


def _run_ranks(target, world: int, *args) -> dict:
    """``target(rank, world, port, *args, results)`` in a process per rank; what each put in ``results``, by rank."""
    port, context = _free_port(), mp.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=target, args=(rank, world, port, *args, results)) for rank in range(world)]
    for process in processes:
        process.start()
    got = dict((rank, rest) for rank, *rest in (results.get(timeout=300) for _ in processes))
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    return got


def _rank(rank: int, world: int, port: int, deadlines: dict, results) -> None:
    with _agreement_of_rank(rank, world, port) as agreement:
        decisions = []
        for step in range(1, 5):
            request = None
            if step == 2 and rank in deadlines:
                request = CheckpointRequest("notice" if rank == 2 else "SIGTERM", True, deadlines[rank])
            decisions.append(agreement.exchange(step, request, due=False))
        agreement.drain()
        # A rank out of step: every rank is told.
        error = None
        try:
            agreement.exchange(10 + (rank == world - 1), None, due=False)
            agreement.collect()
        except CheckpointError as exc:
            error = str(exc)
        results.put((rank, [None if d is None else (d.save, d.request.reason, d.request.stop, d.request.deadline,
                                                     d.origin) for d in decisions], error))


def test_four_gloo_ranks_reach_one_decision_with_the_earliest_deadline():
    deadlines = {1: 2_000_000_500.0, 2: 2_000_000_100.0}  # ranks 1 and 2 asked; rank 2's deadline is earlier
    for rank, (decisions, error) in _run_ranks(_rank, 4, deadlines).items():
        # The request of step 2 is acted on at step 3, identically on every rank; nothing before or after.
        assert decisions[0] is None and decisions[1] is None and decisions[3] is None
        save, reason, stop, deadline, origin = decisions[2]
        assert (save, reason, stop, deadline) == (True, "notice", True, 2_000_000_100.0)
        assert origin == ("self" if rank in deadlines else "peer")
        assert error is not None and "different steps" in error



def test_world_change_flag_survives_the_or_and_leaves_the_step_check_intact():
    """One rank told of a new world sets the flag; every rank reads it, and the step check still works."""
    for step in (0, 7, Word.STEP_MASK):
        word = reduce_or(Word.encode(step, False, False, 0, world=True), Word.encode(step, True, True, 7))
        assert word & Word.WORLD and Word.steps_agree(word) and Word.reason(word) == 7
        assert word < (1 << 63)
    assert not Word.encode(5, True, True, 7) & Word.WORLD


def test_the_timing_flag_survives_the_or_and_leaves_the_rest_intact():
    """A notice's timing checkpoint asked on one rank is saved the emergency's way on every rank."""
    for step in (0, 7, Word.STEP_MASK):
        word = reduce_or(Word.encode(step, False, False, 7, timing=True), Word.encode(step, False, True, 0))
        assert word & Word.TIMING and Word.steps_agree(word) and Word.reason(word) == 7 and word & Word.SAVE
        assert not word & (Word.STOP | Word.WORLD) and word < (1 << 63)
    assert not Word.encode(5, True, True, 7, world=True) & Word.TIMING


def _timing_rank(rank: int, world: int, port: int, results) -> None:
    with _agreement_of_rank(rank, world, port) as agreement:
        decisions = []
        for step in range(1, 4):
            request = CheckpointRequest("notice", timing=True) if step == 1 and rank == 1 else None
            decisions.append(agreement.exchange(step, request, due=False))
        agreement.drain()
        results.put((rank, [None if d is None else (d.save, d.request.reason, d.request.stop, d.request.timing)
                            for d in decisions]))


def test_a_timing_request_of_one_rank_is_a_timing_checkpoint_on_every_rank():
    got = _run_ranks(_timing_rank, 2)
    for rank in range(2):
        assert got[rank] == [[None, (True, "notice", False, True), None]], rank
