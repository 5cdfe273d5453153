"""runner.integrations.lightning with a real lightning.Trainer, a tiny LightningModule and a ResumableSampler.

The interrupted run receives SIGTERM at step 17, in the middle of its second epoch (13 batches an epoch),
or at step 13, its first epoch's last batch; the run that resumes is on a "new node" (an empty local folder,
the same durable URL). With the sampler's position and the RNG states in the callback's state, its final
weights equal those of an uninterrupted run. (tests/integrations/test_end_to_end.py runs the same example
as real jobs, preempted through the agent.)
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import warnings
from pathlib import Path

import pytest
import structlog
import torch

from runner.checkpoint import RestoreError

# lightning, the example and runner.integrations.lightning are imported by the tests, not at collection
# (tests/integrations/lightning_cases.py says why).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning is not installed")
STEPS = "40"


def committed(root: Path) -> dict[int, dict]:
    return {int(p.name.split("-")[1]): json.loads((p / "manifest.json").read_text())
            for p in root.glob("step-*") if (p / "manifest.json").is_file()}


def _example(folder: Path | None = None):
    from .lightning_cases import RunnerCallback, example

    trainer, model, loader = example.build(example.parse(["--steps", STEPS]))
    if folder is not None:
        next(c for c in trainer.callbacks if isinstance(c, RunnerCallback)).checkpoints.local_dir = folder
    return trainer, model, loader


@pytest.fixture(scope="module")
def uninterrupted_sha(tmp_path_factory) -> str:
    """The example trained once, start to end, outside the runner."""
    from .lightning_cases import example

    trainer, model, loader = _example(tmp_path_factory.mktemp("uninterrupted"))
    trainer.fit(model, train_dataloaders=loader)
    return example.weights_sha256(model)


@pytest.mark.parametrize("stop", [17, 13], ids=["mid-epoch", "epoch-end"])
def test_sigterm_commits_that_step_on_both_tiers_and_a_new_node_resumes_bit_exact(
        tmp_path, monkeypatch, uninterrupted_sha, stop):
    from .lightning_cases import SigtermAt, example, last_checkpoint

    durable = tmp_path / "durable"
    monkeypatch.setenv("RUNNER_CHECKPOINT_URL", f"file://{durable}")
    monkeypatch.setenv("RUNNER_CHECKPOINT_DIR", str(tmp_path / "node1"))
    trainer, model, loader = _example()
    trainer.callbacks.insert(0, SigtermAt(stop))
    assert last_checkpoint() is None
    with structlog.testing.capture_logs() as logs, pytest.raises(SystemExit) as exited:
        trainer.fit(model, train_dataloaders=loader)
    assert exited.value.code == 0  # the process exits instead of carrying on after fit()
    assert f"stopping at step {stop} for a preemption; the checkpoint is committed" in [e["event"] for e in logs]
    for tier in (tmp_path / "node1", durable):
        (step, manifest), = committed(tier).items()
        assert step == stop and manifest["emergency"] and manifest["layout"] == "folder"
        assert manifest["payload"]["framework"] == "lightning" and manifest["payload"]["model"] == "Regressor"
        assert [f["name"] for f in manifest["files"]] == ["model.ckpt"]

    monkeypatch.setenv("RUNNER_CHECKPOINT_DIR", str(tmp_path / "node2"))
    trainer, model, loader = _example()
    resume = last_checkpoint()
    assert resume == str(tmp_path / "node2" / f"step-{stop:08d}" / "model.ckpt")
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        trainer.fit(model, train_dataloaders=loader, ckpt_path=resume)
    assert example.weights_sha256(model) == uninterrupted_sha
    # The loader's ResumableSampler makes the resume exact: Lightning's "dataloader is not resumable" is not shown.
    assert not [w for w in warned if "not resumable" in str(w.message)], [str(w.message) for w in warned]


def _fit(model, folder: Path, steps: int = 6, **options):
    from .lightning_cases import RunnerCallback, example, last_checkpoint, lightning

    lightning.seed_everything(0, verbose=False)
    data = example.dataset()
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    callback = RunnerCallback(local_dir=folder, exit_on_stop=False, **options)
    trainer = lightning.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    trainer.fit(model, train_dataloaders=loader, ckpt_path=last_checkpoint())
    return trainer


def test_outside_the_runner_it_checkpoints_into_the_given_folder_with_one_log_line(tmp_path):
    from .lightning_cases import example

    with structlog.testing.capture_logs() as logs:
        _fit(example.Regressor(), tmp_path / "ckpt", every_steps=3)
    assert sorted(committed(tmp_path / "ckpt")) == [3, 6]
    told = [e["event"] for e in logs if "not under the runner" in e["event"]]
    assert len(told) == 1 and str(tmp_path / "ckpt") in told[0]


def test_it_resumes_from_its_own_checkpoint_and_goes_on(tmp_path):
    from .lightning_cases import example

    _fit(example.Regressor(), tmp_path / "ckpt", steps=3, every_steps=3)
    trainer = _fit(example.Regressor(), tmp_path / "ckpt", steps=6, every_steps=3)
    assert trainer.global_step == 6 and sorted(committed(tmp_path / "ckpt")) == [3, 6]


def test_a_checkpoint_of_another_model_is_refused_naming_both(tmp_path):
    from .lightning_cases import Wider, example

    _fit(example.Regressor(), tmp_path / "ckpt", every_steps=3)
    with pytest.raises(RestoreError) as refused:
        _fit(Wider(), tmp_path / "ckpt", every_steps=3)
    assert "Regressor" in str(refused.value) and "Wider" in str(refused.value)


def test_a_checkpoint_of_another_framework_is_refused_naming_both(tmp_path):
    from runner.checkpoint import Checkpointer

    from .lightning_cases import RunnerCallback, last_checkpoint

    plain = Checkpointer(local_dir=tmp_path / "ckpt", model=torch.nn.Linear(2, 2))
    plain.save(4)
    plain.close()
    RunnerCallback(local_dir=tmp_path / "ckpt")
    with pytest.raises(RestoreError, match=r"written by runner\.checkpoint\.Checkpointer, not by the lightning "
                                           r"integration"):
        last_checkpoint()


def test_an_unsupported_lightning_version_fails_at_import_naming_the_supported_ones(monkeypatch):
    from .lightning_cases import lightning

    monkeypatch.setattr(lightning, "__version__", "1.9.5")
    monkeypatch.delitem(sys.modules, "runner.integrations.lightning")
    with pytest.raises(ImportError, match=r"supports lightning >=2\.2,<3; 1\.9\.5 is installed"):
        importlib.import_module("runner.integrations.lightning")


def test_each_step_and_its_nan_losses_reach_the_jobs_telemetry(tmp_path):
    from .lightning_cases import NanOnSteps2And5, RunnerCallback

    trainer = _fit(NanOnSteps2And5(), tmp_path / "ckpt", steps=6, interval="1h")
    telemetry = next(c for c in trainer.callbacks if isinstance(c, RunnerCallback)).checkpoints.ckpt.telemetry
    assert telemetry.steps == 6 and telemetry.nan_steps == 2
