"""runner.integrations.transformers with a real Hugging Face Trainer and a tiny GPT-2 built from a config.

The interrupted run receives SIGTERM at step 5 (it sends it to itself at that step, so the test does not
depend on timing); the run that resumes is on a "new node" (an empty local folder, the same durable URL).
Its final weights must equal those of an uninterrupted run. (tests/integrations/test_end_to_end.py runs the
same example as real jobs, preempted through the agent.)
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import structlog
import torch

from runner.checkpoint import Checkpointer, RestoreError

# transformers, the example and runner.integrations.transformers are imported by the tests, not at collection
# (tests/integrations/transformers_cases.py says why).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="transformers is not installed")
STEPS = "12"


def committed(root: Path) -> dict[int, dict]:
    return {int(p.name.split("-")[1]): json.loads((p / "manifest.json").read_text())
            for p in root.glob("step-*") if (p / "manifest.json").is_file()}


@pytest.fixture(scope="module")
def uninterrupted_sha(tmp_path_factory) -> str:
    """The example trained once, start to end, outside the runner."""
    from .transformers_cases import example, last_checkpoint

    folder = tmp_path_factory.mktemp("uninterrupted")
    trainer = example.build(example.parse(["--steps", STEPS, "--output-dir", str(folder / "out")]))
    assert last_checkpoint() is None
    trainer.train()
    return example.weights_sha256(trainer.model)


def test_sigterm_mid_run_commits_that_step_on_both_tiers_and_a_new_node_resumes_bit_exact(
        tmp_path, monkeypatch, uninterrupted_sha):
    from .transformers_cases import SigtermAt, example, last_checkpoint

    durable = tmp_path / "durable"
    monkeypatch.setenv("RUNNER_CHECKPOINT_URL", f"file://{durable}")
    monkeypatch.setenv("RUNNER_CHECKPOINT_DIR", str(tmp_path / "node1"))
    trainer = example.build(example.parse(["--steps", STEPS, "--output-dir", str(tmp_path / "out")]))
    trainer.callback_handler.callbacks.insert(0, SigtermAt(5))
    assert last_checkpoint() is None
    with structlog.testing.capture_logs() as logs, pytest.raises(SystemExit) as exited:
        trainer.train()
    assert exited.value.code == 0  # the process exits instead of carrying on after train()
    assert "stopping at step 5 for a preemption; the checkpoint is committed" in [e["event"] for e in logs]
    for tier in (tmp_path / "node1", durable):
        (step, manifest), = committed(tier).items()
        assert step == 5 and manifest["emergency"] and manifest["layout"] == "folder"
        assert manifest["payload"]["framework"] == "transformers"
        assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"} <= {
            f["name"] for f in manifest["files"]}
    assert not (tmp_path / "out" / "checkpoint-5").exists()  # moved into the runner's folder, not copied

    monkeypatch.setenv("RUNNER_CHECKPOINT_DIR", str(tmp_path / "node2"))
    resumed = example.build(example.parse(["--steps", STEPS, "--output-dir", str(tmp_path / "out")]))
    resume = last_checkpoint()
    assert resume == str(tmp_path / "node2" / "step-00000005")
    with transformers_warnings() as warned, structlog.testing.capture_logs() as logs:
        resumed.train(resume_from_checkpoint=resume)
    assert example.weights_sha256(resumed.model) == uninterrupted_sha
    # A bit-exact resume says nothing alarming: the tied lm_head is explained, the loss type is set.
    assert not [w for w in warned if "missing keys" in w or "loss_type" in w], warned
    assert "restored tied weights with the weights they share: lm_head.weight is transformer.wte.weight" in [
        e["event"] for e in logs]


@contextmanager
def transformers_warnings():
    """The warnings transformers logs meanwhile (its once-only warnings included, as if for the first time)."""
    import logging

    class Keep(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                warned.append(record.getMessage())

    warned: list[str] = []
    logging.Logger.warning_once.cache_clear()
    handler, root = Keep(), logging.getLogger("transformers")
    root.addHandler(handler)
    try:
        yield warned
    finally:
        root.removeHandler(handler)


def _tiny_trainer(output_dir: Path, model, callback=None, **callback_options):
    from transformers import Trainer, TrainingArguments

    from .transformers_cases import RunnerCallback, example

    args = TrainingArguments(output_dir=str(output_dir), max_steps=6, per_device_train_batch_size=8, seed=0,
                             save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, logging_steps=100)
    callback = callback or RunnerCallback(exit_on_stop=False, **callback_options)
    return Trainer(model=model, args=args, train_dataset=example.RandomTokens(), callbacks=[callback]), callback


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                                      bos_token_id=0, eos_token_id=0))


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16,
                                        bos_token_id=0, eos_token_id=0, pad_token_id=0))


def test_outside_the_runner_it_checkpoints_into_the_output_dir_with_one_log_line(tmp_path):
    with structlog.testing.capture_logs() as logs:
        trainer, _ = _tiny_trainer(tmp_path / "out", _gpt2(), every_steps=3)
        trainer.train()
    assert sorted(committed(tmp_path / "out")) == [3, 6]
    told = [e["event"] for e in logs if "not under the runner" in e["event"]]
    assert len(told) == 1 and str(tmp_path / "out") in told[0]


def test_a_checkpoint_of_another_model_is_refused_naming_both(tmp_path):
    from .transformers_cases import last_checkpoint

    trainer, _ = _tiny_trainer(tmp_path / "out", _gpt2(), local_dir=tmp_path / "ckpt", every_steps=3)
    trainer.train()
    _tiny_trainer(tmp_path / "out2", _llama(), local_dir=tmp_path / "ckpt")
    with pytest.raises(RestoreError) as refused:
        last_checkpoint()
    assert "GPT2LMHeadModel" in str(refused.value) and "LlamaForCausalLM" in str(refused.value)


def test_a_checkpoint_of_another_framework_is_refused_naming_both(tmp_path):
    from .transformers_cases import last_checkpoint

    plain = Checkpointer(local_dir=tmp_path / "ckpt", model=torch.nn.Linear(2, 2))
    plain.save(4)
    plain.close()
    _tiny_trainer(tmp_path / "out", _gpt2(), local_dir=tmp_path / "ckpt")
    with pytest.raises(RestoreError, match=r"written by runner\.checkpoint\.Checkpointer, not by the transformers "
                                           r"integration"):
        last_checkpoint()


def test_the_plain_library_refuses_a_trainer_checkpoint_naming_who_wrote_it(tmp_path):
    trainer, _ = _tiny_trainer(tmp_path / "out", _gpt2(), local_dir=tmp_path / "ckpt", every_steps=3)
    trainer.train()
    plain = Checkpointer(local_dir=tmp_path / "ckpt", model=torch.nn.Linear(2, 2))
    with pytest.raises(RestoreError, match=r"written by the transformers [\d.]+ integration \(GPT2LMHeadModel\), "
                                           r"not by runner\.checkpoint\.Checkpointer"):
        plain.restore()
    plain.close()


def test_an_unsupported_transformers_version_fails_at_import_naming_the_supported_ones(monkeypatch):
    import transformers

    monkeypatch.setattr(transformers, "__version__", "4.30.2")
    monkeypatch.delitem(sys.modules, "runner.integrations.transformers")
    with pytest.raises(ImportError, match=r"supports transformers >=4\.40,<6; 4\.30\.2 is installed"):
        importlib.import_module("runner.integrations.transformers")


def test_the_trainers_own_saves_are_committed_too_and_stay_in_its_output_dir(tmp_path):
    from transformers import Trainer, TrainingArguments

    from .transformers_cases import RunnerCallback, example

    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=8, seed=0,
                             save_strategy="steps", save_steps=2, save_total_limit=2, report_to=[], use_cpu=True,
                             disable_tqdm=True)
    callback = RunnerCallback(local_dir=tmp_path / "ckpt", interval="1h", keep=3, exit_on_stop=False)
    Trainer(model=_gpt2(), args=args, train_dataset=example.RandomTokens(), callbacks=[callback]).train()
    assert sorted(committed(tmp_path / "ckpt")) == [2, 4, 6]
    assert sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    assert (tmp_path / "ckpt" / "step-00000006" / "model.safetensors").stat().st_nlink == 2  # linked, not copied


def test_last_checkpoint_is_never_newer_than_the_step_the_runner_handed_over(tmp_path, monkeypatch):
    from .transformers_cases import last_checkpoint

    trainer, _ = _tiny_trainer(tmp_path / "out", _gpt2(), local_dir=tmp_path / "ckpt", every_steps=3)
    trainer.train()
    assert sorted(committed(tmp_path / "ckpt")) == [3, 6]
    monkeypatch.setenv("RUNNER_RESUME_STEP", "3")
    _tiny_trainer(tmp_path / "out", _gpt2(), local_dir=tmp_path / "ckpt")
    assert last_checkpoint() == str(tmp_path / "ckpt" / "step-00000003")


def test_each_step_and_its_nan_losses_reach_the_jobs_telemetry(tmp_path):
    model = _gpt2()
    calls = []

    def nan_on_steps_2_and_5(module, args, output):
        calls.append(None)
        if len(calls) in (2, 5):  # a NaN loss whose gradient stays finite, so later steps are not poisoned
            output.loss = output.loss - output.loss.detach() + float("nan")
        return output

    model.register_forward_hook(nan_on_steps_2_and_5)
    trainer, callback = _tiny_trainer(tmp_path / "out", model, local_dir=tmp_path / "ckpt", interval="1h")
    trainer.train()
    telemetry = callback.checkpoints.ckpt.telemetry
    assert telemetry.steps == 6 and telemetry.nan_steps == 2


def test_a_damaged_newest_checkpoint_is_skipped_for_the_previous_one(tmp_path):
    from .transformers_cases import last_checkpoint

    trainer, _ = _tiny_trainer(tmp_path / "out", _gpt2(), local_dir=tmp_path / "ckpt", every_steps=3)
    trainer.train()
    weights = tmp_path / "ckpt" / "step-00000006" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    _tiny_trainer(tmp_path / "out", _gpt2(), local_dir=tmp_path / "ckpt")
    assert last_checkpoint() == str(tmp_path / "ckpt" / "step-00000003")


def test_last_checkpoint_asked_before_the_trainer_exists_is_checked_against_its_model(tmp_path):
    from .transformers_cases import RunnerCallback, last_checkpoint

    trainer, _ = _tiny_trainer(tmp_path / "out", _gpt2(), local_dir=tmp_path / "ckpt", every_steps=3)
    trainer.train()
    callback = RunnerCallback(local_dir=tmp_path / "ckpt", exit_on_stop=False)
    assert last_checkpoint() == str(tmp_path / "ckpt" / "step-00000006")  # no Trainer yet: nothing built
    assert callback.checkpoints.ckpt is None
    with pytest.raises(RestoreError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        _tiny_trainer(tmp_path / "out2", _llama(), callback=callback)
