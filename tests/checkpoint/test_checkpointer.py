"""Saving and restoring in one process: what a checkpoint holds and when one is taken."""

from __future__ import annotations

import json
import random

import numpy
import pytest
import torch

from runner.checkpoint import CheckpointConfigError, Checkpointer

from .conftest import same


def test_restore_with_nothing_committed_returns_zero(setup, tmp_path):
    """restore() on an empty folder returns step 0 and leaves the objects alone."""
    before = setup.weights()
    with setup.checkpointer(tmp_path) as ckpt:
        assert ckpt.restore() == 0
    assert same(before, setup.weights())


def test_restore_brings_back_every_registered_object(make_setup, tmp_path):
    """A fresh process restores model, optimizer, scheduler, sampler and extra values to the saved step."""
    first = make_setup(seed=0)
    first.train(5)
    list(zip(range(7), iter(first.sampler)))
    extra = {"tokens": 1234, "note": "hello"}
    with first.checkpointer(tmp_path, extra=extra) as ckpt:
        ckpt.save(5)
        assert ckpt.wait()
    second = make_setup(seed=99)
    restored_extra = {"tokens": 0}
    with second.checkpointer(tmp_path, extra=restored_extra) as ckpt:
        assert ckpt.restore() == 5
    assert same(first.weights(), second.weights())
    assert second.scheduler.state_dict() == first.scheduler.state_dict()
    assert (second.sampler.epoch, second.sampler.position) == (first.sampler.epoch, first.sampler.position)
    assert restored_extra == extra
    rng = torch.get_rng_state()
    first.train(1)
    torch.set_rng_state(rng)
    second.train(1)  # same optimizer moments: the next step matches too
    assert same(first.weights(), second.weights())


def test_restore_puts_back_python_numpy_and_torch_rng(setup, tmp_path):
    """After a restore, python, NumPy and torch draw what they would have drawn at the save."""
    with setup.checkpointer(tmp_path) as ckpt:
        ckpt.save(1)
        ckpt.wait()
        expected = (random.random(), numpy.random.rand(), torch.rand(1).item())
        ckpt.restore()
        assert (random.random(), numpy.random.rand(), torch.rand(1).item()) == expected


def test_save_returns_once_staged_so_training_may_change_weights(setup, tmp_path):
    """Changing the weights right after save() does not change what the checkpoint holds."""
    with setup.checkpointer(tmp_path) as ckpt:
        ckpt.save(1)
        saved = setup.weights()
        with torch.no_grad():
            for p in setup.model.parameters():
                p.add_(1.0)
        ckpt.wait()
        ckpt.restore()
    assert same(saved, setup.weights())


def test_manifest_describes_the_checkpoint(setup, tmp_path, monkeypatch):
    """The manifest names every file with size and checksum, plus step, attempt, job id and versions."""
    monkeypatch.setenv("RUNNER_ATTEMPT", "4")
    monkeypatch.setenv("RUNNER_JOB_ID", "job-7")
    with setup.checkpointer(tmp_path) as ckpt:
        ckpt.save(12)
    folder = tmp_path / "step-00000012"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert (manifest["step"], manifest["attempt"], manifest["job_id"]) == (12, 4, "job-7")
    assert manifest["checksum"] in ("xxh3_64", "crc32")
    assert manifest["versions"]["torch"] == torch.__version__
    for entry in manifest["files"]:
        assert (folder / entry["name"]).stat().st_size == entry["bytes"]
    assert sorted(p.name for p in folder.iterdir()) == sorted([e["name"] for e in manifest["files"]] + ["manifest.json"])


def test_defaults_come_from_the_runner_variables(setup, tmp_path, monkeypatch):
    """RUNNER_CHECKPOINT_DIR and RUNNER_CHECKPOINT_URL choose the tiers when no option is given."""
    monkeypatch.setenv("RUNNER_CHECKPOINT_DIR", str(tmp_path / "local"))
    monkeypatch.setenv("RUNNER_CHECKPOINT_URL", f"file://{tmp_path / 'durable'}")
    with Checkpointer(**setup.objects()) as ckpt:
        ckpt.save(3)
    assert (tmp_path / "local" / "step-00000003" / "manifest.json").is_file()
    assert (tmp_path / "durable" / "step-00000003" / "manifest.json").is_file()


def test_every_steps_saves_on_multiples_only(setup, tmp_path):
    """every_steps=3 saves at steps 3 and 6 and nowhere else."""
    with setup.checkpointer(tmp_path, every_steps=3, keep=10) as ckpt:
        for step in range(1, 8):
            ckpt.step(step)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000003", "step-00000006"]


def test_step_saves_nothing_before_the_interval(setup, tmp_path):
    """With interval='1h', step() takes no checkpoint during a short run."""
    with setup.checkpointer(tmp_path, interval="1h") as ckpt:
        for step in range(1, 50):
            ckpt.step(step)
    assert list(tmp_path.iterdir()) == []


def test_keep_leaves_the_newest_checkpoints(setup, tmp_path):
    """keep=2 leaves the two newest committed checkpoints."""
    with setup.checkpointer(tmp_path, keep=2) as ckpt:
        for step in (1, 2, 3, 4):
            ckpt.save(step)
            ckpt.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000003", "step-00000004"]


def test_keep_ignores_uncommitted_folders(setup, tmp_path):
    """A newer folder without a manifest does not count: keep=1 still keeps the newest committed one."""
    with setup.checkpointer(tmp_path, keep=1) as ckpt:
        ckpt.save(1)
        ckpt.wait()
        (tmp_path / "step-00000009").mkdir()  # a save that died before its manifest
        ckpt.local.prune(1)
        assert ckpt.restore() == 1


def test_resaving_a_step_replaces_the_old_folder(setup, tmp_path):
    """A resumed run that reaches a step again overwrites that folder's checkpoint."""
    with setup.checkpointer(tmp_path) as ckpt:
        ckpt.save(2)
        ckpt.wait()
        setup.train(1)
        trained = setup.weights()
        ckpt.save(2)
        ckpt.wait()
        setup.train(1)
        assert ckpt.restore() == 2
    assert same(trained, setup.weights())


def test_durable_tier_restores_when_the_local_tier_is_empty(setup, make_setup, tmp_path):
    """A new node with an empty local folder restores from the durable URL."""
    url = "memory://ckpt-test-restore"
    with setup.checkpointer(tmp_path / "node-a", durable_url=url) as ckpt:
        ckpt.save(8)
    other = make_setup(seed=5)
    with other.checkpointer(tmp_path / "node-b", durable_url=url) as ckpt:
        assert ckpt.restore() == 8
    assert same(setup.weights(), other.weights())
    assert (tmp_path / "node-b" / "step-00000008" / "manifest.json").is_file()


def test_objects_without_state_dict_are_refused(tmp_path):
    """A registered value without state_dict() fails at construction, pointing at extra=."""
    with pytest.raises(TypeError, match="extra="):
        Checkpointer(local_dir=tmp_path, epoch=3)


@pytest.mark.parametrize("options", [{"keep": 0}, {"interval": "soon"}, {"every_steps": 0}])
def test_bad_options_are_refused(tmp_path, options):
    """keep=0, a malformed interval and every_steps=0 fail at construction, naming the option."""
    with pytest.raises(CheckpointConfigError, match=next(iter(options))):
        Checkpointer(local_dir=tmp_path, **options)
