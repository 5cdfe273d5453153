"""A tiny GPT-2 trained with the Hugging Face Trainer, protected by the runner (examples/transformers).

The model is built from a config (nothing is downloaded) and the data are random tokens, so this runs on
a CPU in seconds. The two runner lines are marked; everything else is a plain Trainer script.

    python train.py --steps 60            # outside the runner: checkpoints into ./out
    runner submit job.yaml                # under the runner: interval, keep and tiers from the job file
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from runner.integrations.transformers import RunnerCallback, last_checkpoint  # noqa: E402  <- the runner


class RandomTokens(torch.utils.data.Dataset):
    """Fixed random token sequences (the same for every run)."""

    def __init__(self, count: int = 256, length: int = 16, vocab: int = 64) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.tokens = torch.randint(0, vocab, (count, length), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


class Progress(TrainerCallback):
    """Prints a line every few steps, and slows the steps down when asked (to have time to preempt it)."""

    def __init__(self, every: int, step_time: float) -> None:
        self.every, self.step_time = every, step_time

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0:
            print(f"step {state.global_step}", flush=True)
        if self.step_time:
            time.sleep(self.step_time)


def weights_sha256(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-time", type=float, default=0.0, help="seconds added to each step")
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--output-dir", default="out")
    return parser.parse_args(argv)


def build(args: argparse.Namespace) -> Trainer:
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
                        eos_token_id=0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # the class's name does not say which loss; unset, transformers warns it is None
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=8, learning_rate=1e-3,
        seed=0, save_strategy="no", logging_steps=10, report_to=[], use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0)
    trainer = Trainer(model=model, args=training, train_dataset=RandomTokens(),
                      callbacks=[Progress(args.log_every, args.step_time), RunnerCallback()])  # <- the runner
    return trainer


def main(argv=None) -> None:
    trainer = build(parse(argv))
    resume = last_checkpoint()  # <- the runner: None on a fresh start
    print(f"resuming from {resume}" if resume else "starting fresh", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    print(f"final weights sha256 {weights_sha256(trainer.model)}", flush=True)


if __name__ == "__main__":
    main()
