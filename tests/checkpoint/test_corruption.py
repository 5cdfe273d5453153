"""restore() never loads a damaged or partial checkpoint: it falls back to the newest one that verifies."""

from __future__ import annotations

import pytest

from .conftest import same


@pytest.fixture
def two_checkpoints(setup, tmp_path):
    """Checkpoints at steps 1 and 2 (different weights); returns the weights saved at step 1."""
    with setup.checkpointer(tmp_path) as ckpt:
        ckpt.save(1)
        ckpt.wait()
        at_one = setup.weights()
        setup.train(2)
        ckpt.save(2)
    return at_one


def _restore(make_setup, tmp_path):
    other = make_setup(seed=42)
    with other.checkpointer(tmp_path) as ckpt:
        return ckpt.restore(), other.weights()


def _data_file(tmp_path, step=2):
    return tmp_path / f"step-{step:08d}" / "data-00000.bin"


def test_a_flipped_byte_falls_back(two_checkpoints, make_setup, tmp_path):
    """One flipped byte in the newest checkpoint fails its checksum; step 1 is restored instead."""
    path = _data_file(tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    step, weights = _restore(make_setup, tmp_path)
    assert step == 1 and same(weights, two_checkpoints)


def test_a_truncated_file_falls_back(two_checkpoints, make_setup, tmp_path):
    """A truncated data file is detected and skipped."""
    path = _data_file(tmp_path)
    path.write_bytes(path.read_bytes()[:-10])
    assert _restore(make_setup, tmp_path)[0] == 1


def test_a_missing_manifest_means_not_committed(two_checkpoints, make_setup, tmp_path):
    """Without its manifest a checkpoint is ignored."""
    (tmp_path / "step-00000002" / "manifest.json").unlink()
    assert _restore(make_setup, tmp_path)[0] == 1


def test_a_garbled_manifest_falls_back(two_checkpoints, make_setup, tmp_path):
    """A manifest that is not valid JSON is treated as damage."""
    (tmp_path / "step-00000002" / "manifest.json").write_text('{"format": 1, "st')
    assert _restore(make_setup, tmp_path)[0] == 1


def test_a_missing_state_file_falls_back(two_checkpoints, make_setup, tmp_path):
    """A listed file that is gone makes the checkpoint unusable."""
    (tmp_path / "step-00000002" / "state.pkl").unlink()
    assert _restore(make_setup, tmp_path)[0] == 1


def test_all_damaged_means_a_fresh_start(two_checkpoints, make_setup, tmp_path):
    """When no checkpoint verifies, restore() returns 0."""
    for step in (1, 2):
        _data_file(tmp_path, step).write_bytes(b"garbage")
    assert _restore(make_setup, tmp_path)[0] == 0


def test_a_damaged_local_copy_is_replaced_from_the_durable_tier(setup, make_setup, tmp_path):
    """When the local copy of the newest step is damaged, the durable copy of that step is used."""
    with setup.checkpointer(tmp_path, durable_url="memory://ckpt-test-damaged") as ckpt:
        ckpt.save(3)
    saved = setup.weights()
    _data_file(tmp_path, 3).write_bytes(b"garbage")
    other = make_setup(seed=1)
    with other.checkpointer(tmp_path, durable_url="memory://ckpt-test-damaged") as ckpt:
        assert ckpt.restore() == 3
    assert same(saved, other.weights())


def test_a_forged_state_pkl_is_refused_without_running_it(tmp_path):
    """A state.pkl that would run a command when unpickled is refused at restore, and the command never runs."""
    import hashlib
    import os
    import json
    import pickle

    from runner.checkpoint import Checkpointer
    from runner.checkpoint.checksum import digest

    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    folder = tmp_path / "ckpt" / "step-00000009"
    folder.mkdir(parents=True)
    payload = pickle.dumps({"step": 9, "objects": {}, "extra": Exploit(), "rng": {}})
    (folder / "state.pkl").write_bytes(payload)
    manifest = {"format": 1, "id": hashlib.md5(payload).hexdigest(), "step": 9, "created_at": 0.0,
                "checksum": "xxh3_64", "files": [{"name": "state.pkl", "bytes": len(payload),
                                                  "checksum": digest(payload)}]}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    ckpt = Checkpointer(local_dir=tmp_path / "ckpt")
    assert ckpt.restore() == 0  # skipped as damaged, never loaded
    ckpt.close()
    assert not marker.exists()


def test_a_manifest_naming_a_file_outside_its_folder_is_refused(tmp_path):
    """A manifest listing ../ or absolute file names is not a checkpoint: restore skips it."""
    import json

    from runner.checkpoint import Checkpointer

    folder = tmp_path / "ckpt" / "step-00000003"
    folder.mkdir(parents=True)
    (tmp_path / "ckpt" / "secret").write_bytes(b"x")
    manifest = {"format": 1, "id": "x", "step": 3, "created_at": 0.0, "checksum": "crc32",
                "files": [{"name": "../secret", "bytes": 1, "checksum": "8cdc1683"}]}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    ckpt = Checkpointer(local_dir=tmp_path / "ckpt")
    assert ckpt.restore() == 0
    ckpt.close()
