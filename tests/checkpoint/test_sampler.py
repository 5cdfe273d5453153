"""ResumableSampler: its position survives a restart, and so does the DataLoader's random stream."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from runner.checkpoint import ResumableSampler


def test_each_epoch_is_a_permutation_that_changes_with_the_epoch():
    """Every index appears once per epoch, in a different order each epoch."""
    sampler = ResumableSampler(20, seed=5)
    first, second = list(sampler), list(sampler)
    assert sorted(first) == sorted(second) == list(range(20))
    assert first != second


def test_without_shuffle_the_order_is_sequential():
    """shuffle=False yields 0..n-1."""
    assert list(ResumableSampler(range(6), shuffle=False)) == list(range(6))


def test_resume_mid_epoch_yields_the_rest_of_that_epoch():
    """A sampler loaded from a mid-epoch state yields exactly the indices the original had not yet given."""
    original = ResumableSampler(30, seed=2)
    iterator = iter(original)
    seen = [next(iterator) for _ in range(11)]
    resumed = ResumableSampler(30, seed=2)
    resumed.load_state_dict(original.state_dict())
    rest = list(resumed)
    assert seen + rest == original.order(0)
    assert list(resumed) == original.order(1)


def test_resume_at_the_end_of_an_epoch_starts_the_next():
    """A state taken after the last index of an epoch resumes at the start of the next epoch."""
    original = ResumableSampler(8, seed=4)
    iterator = iter(original)
    for _ in range(8):
        next(iterator)
    resumed = ResumableSampler(8, seed=4)
    resumed.load_state_dict(original.state_dict())
    assert list(resumed) == original.order(1)


def test_a_resumed_dataloader_sees_the_same_random_stream():
    """Re-creating a DataLoader iterator mid-epoch does not shift torch's global generator after a resume."""
    dataset = TensorDataset(torch.arange(24.0))

    def run(sampler, batches):
        loader = DataLoader(dataset, batch_size=4, sampler=sampler)
        out = []
        for (batch,) in loader:
            out.append((batch.tolist(), torch.rand(1).item()))  # a dropout-like draw per step
            if len(out) == batches:
                break
        return out

    torch.manual_seed(0)
    uninterrupted = run(ResumableSampler(24, seed=1), 5)
    torch.manual_seed(0)
    sampler = ResumableSampler(24, seed=1)
    head = run(sampler, 2)
    state, rng = sampler.state_dict(), torch.get_rng_state()
    torch.manual_seed(12345)  # a new process
    resumed = ResumableSampler(24, seed=1)
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)  # what Checkpointer.restore() does
    tail = run(resumed, 3)
    assert head + tail == uninterrupted


def test_a_different_dataset_length_is_refused():
    """Loading a state taken over another dataset size raises, naming both sizes."""
    state = ResumableSampler(10).state_dict()
    try:
        ResumableSampler(12).load_state_dict(state)
    except ValueError as exc:
        assert "10" in str(exc) and "12" in str(exc)
    else:
        raise AssertionError("expected ValueError")


def _epoch_of_two_ranks(length: int, seed: int = 7):
    return [ResumableSampler(length, seed=seed, num_replicas=2, rank=r) for r in (0, 1)]


def test_ranks_share_an_epoch_like_distributed_sampler():
    """Two ranks together cover every index once per epoch (padded to equal shares), each a disjoint stride."""
    zero, one = _epoch_of_two_ranks(11)
    a, b = list(zero), list(one)
    assert len(a) == len(b) == len(zero) == 6
    assert sorted(set(a) | set(b)) == list(range(11))
    assert a == zero.order(0)[0::2] and b[:5] == zero.order(0)[1::2]


def test_same_world_size_resumes_each_rank_at_its_exact_position():
    """Restarted with the same world size, each rank goes on with exactly the indices it had not yet given."""
    for rank in (0, 1):
        original = ResumableSampler(20, seed=3, num_replicas=2, rank=rank)
        iterator = iter(original)
        seen = [next(iterator) for _ in range(4)]
        resumed = ResumableSampler(20, seed=3, num_replicas=2, rank=rank)
        resumed.load_state_dict(original.state_dict())
        assert seen + list(resumed) == original.shard(0)


def test_another_world_size_continues_the_epoch_where_the_job_stopped():
    """Two ranks consume 3 indices each; four ranks then share exactly the 14 indices left of that epoch."""
    before = _epoch_of_two_ranks(20)
    seen = []
    for sampler in before:
        iterator = iter(sampler)
        seen += [next(iterator) for _ in range(3)]
    after = [ResumableSampler(20, seed=7, num_replicas=4, rank=r) for r in range(4)]
    for sampler in after:
        sampler.load_state_dict(before[0].state_dict())
    rest = [i for sampler in after for i in sampler]
    order = before[0].order(0)
    assert sorted(set(rest)) == sorted(order[6:]) and not set(rest) & set(seen)
    assert all(sampler.epoch == 1 for sampler in after)  # the epoch ended on every rank


def test_reshard_hands_out_the_rest_of_the_epoch_over_the_new_world():
    """3 ranks take 2 indices each, then the world becomes 2 ranks, then 4: every index of the epoch once."""
    from runner.checkpoint import ResumableSampler

    seen = []
    samplers = [ResumableSampler(30, shuffle=True, seed=5, num_replicas=3, rank=r) for r in range(3)]
    for sampler in samplers:
        it = iter(sampler)
        seen += [next(it) for _ in range(2)]
    survivors = samplers[:2]
    for rank, sampler in enumerate(survivors):
        sampler.reshard(2, rank)
        it = iter(sampler)
        seen += [next(it) for _ in range(3)]
    joined = survivors + [ResumableSampler(30, shuffle=True, seed=5, num_replicas=1, rank=0) for _ in range(2)]
    joined[2].load_state_dict(survivors[0].state_dict())
    joined[3].load_state_dict(survivors[0].state_dict())
    for rank, sampler in enumerate(joined):
        sampler.reshard(4, rank)
        seen += list(sampler)
    assert sorted(set(seen)) == list(range(30))
    assert len(seen) - 30 < 4  # the padding of the last stretch only
    assert all(s.epoch == 1 and s.position == 0 for s in joined)
