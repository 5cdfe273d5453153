"""Restore at the handover: loading a 1 GB one-process checkpoint (8 tensors) from the local tier.

    python benchmarks/restore_handover.py [--state-mb 1000] [--dir /dev/shm] [--repeat 3]

The state is the cloud-recovery benchmark's job (benchmarks/cloud_recovery.py): a small model with eight
buffers of an eighth each. One checkpoint is saved to a local tier under ``--dir`` (default /dev/shm, as
that benchmark's tiers, when it exists), then loaded into a model built afresh, each way in turn,
``--repeat`` times, interleaved so that a busy machine weighs on every row alike:

- *before*: the restore as it was before reading once: a hashing pass over every file (the check ahead of
  the load), then each file read whole into a buffer and verified again, each tensor copied out of it, and
  the copies loaded into the model;
- *one pass, 1 reader* / *4 readers*: every file read once, each tensor's bytes straight into a tensor of
  its own through the checksum (runner/checkpoint/flat_read.py), one file at a time, then four at once (the
  library reads one file per four CPUs at once, at most four);
- *one pass, memory ready*: one reader, with the tensors allocated and touched ahead (what a process started
  ahead does while it waits for the handover: runner/checkpoint/warm_pool.py; the pool is filled outside
  the timing);
- *Checkpointer.restore()*: the library's whole restore (the candidates, the manifest, the read, the load,
  the report; no control channel, so no run manifest), one pass, no memory made ready.

Below the table: how long working out the run manifest takes (hashing the installed packages' list), which a
restore under the runner did between its end and the first step, and a process started ahead now does
while it waits.

Every row is the read and verification of every file plus ``load_state_dict`` into the model, checked
bit-exact after each run. The table gives the median and the best of the runs and each row's median over
the *before* row's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import machine  # noqa: E402
from runner.checkpoint import Checkpointer, flat_read  # noqa: E402
from runner.checkpoint.local import LocalTier, read_verified  # noqa: E402
from runner.checkpoint.manifest import STATE_NAME  # noqa: E402
from runner.checkpoint.restore import load_flat, read_folder, verify_folder  # noqa: E402
from runner.checkpoint.run_manifest import run_manifest  # noqa: E402
from runner.checkpoint.staging import fill, load_skeleton  # noqa: E402
from runner.checkpoint.warm_pool import WarmPool  # noqa: E402


def build_model(state_mb: float, fill: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    for i in range(8):
        n = max(1, int(state_mb * 1e6 / 4 / 8))
        model.register_buffer(f"ballast{i}", torch.rand(n) if fill else torch.zeros(n))
    return model


def read_before(folder: Path, manifest) -> dict:
    """The restore's read before reading once: verify_folder, then read_verified and a copy of each tensor."""
    verify_folder(folder, manifest)
    parts, skeleton = [], None
    for entry in manifest.files:
        data = read_verified(folder / entry["name"], entry, manifest.checksum)
        if entry["name"] == STATE_NAME:
            skeleton = bytes(data)
        else:
            parts.append(torch.frombuffer(data, dtype=torch.uint8))

    def tensor_of(ref):  # a copy of the tensor's bytes out of its file's buffer
        dtype = getattr(torch, ref.dtype)
        if ref.nbytes == 0:
            return torch.empty(ref.shape, dtype=dtype)
        return parts[ref.part][ref.offset:ref.offset + ref.nbytes].view(dtype).view(ref.shape).clone()

    return fill(load_skeleton(skeleton), tensor_of)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-mb", type=float, default=1000)
    parser.add_argument("--dir", default="/dev/shm" if Path("/dev/shm").is_dir() else None)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="restore-handover-", dir=args.dir))
    try:
        saved = build_model(args.state_mb, fill=True)
        with Checkpointer(local_dir=root, model=saved) as ckpt:
            ckpt.save(7)
        expected = {k: v.clone() for k, v in saved.state_dict().items()}
        del saved
        local = LocalTier(root)
        folder = local.folder(7)
        manifest = local.read_manifest(folder)
        model = build_model(args.state_mb, fill=False)

        def load(read) -> None:
            load_flat({"model": model}, {}, read(), str(folder))

        def one_pass_readers(n: int):
            def run() -> None:
                kept, flat_read.READERS = flat_read.READERS, n
                try:
                    load(lambda: read_folder(folder, manifest))
                finally:
                    flat_read.READERS = kept
            return run

        def memory_ready() -> float:
            pool = WarmPool().start(local)
            pool.join()
            kept, flat_read.READERS = flat_read.READERS, 1
            try:
                started = time.perf_counter()
                load(lambda: read_folder(folder, manifest, pool))
                return time.perf_counter() - started
            finally:
                flat_read.READERS = kept

        def whole_restore() -> float:
            with Checkpointer(local_dir=root, model=model) as ckpt:
                started = time.perf_counter()
                assert ckpt.restore() == 7
                return time.perf_counter() - started

        def time_run_manifest() -> float:
            started = time.perf_counter()
            run_manifest()
            return time.perf_counter() - started

        rows = {
            "before (hash pass, read, copy out)": lambda: load(lambda: read_before(folder, manifest)),
            "one pass, 1 reader": one_pass_readers(1),
            "one pass, 4 readers": one_pass_readers(4),
            "one pass, memory ready": memory_ready,
            "Checkpointer.restore() (one pass)": whole_restore,
        }
        times: dict[str, list[float]] = {name: [] for name in rows}
        manifest_s = []
        for _ in range(args.repeat):
            for name, run in rows.items():
                for tensor in model.state_dict().values():
                    tensor.zero_()
                started = time.perf_counter()
                timed = run()
                times[name].append(timed if isinstance(timed, float) else time.perf_counter() - started)
                got = model.state_dict()
                assert all(torch.equal(got[k], v) for k, v in expected.items()), f"{name}: not bit-exact"
            manifest_s.append(time_run_manifest())
    finally:
        shutil.rmtree(root, ignore_errors=True)

    load_avg = os.getloadavg()[0]
    print(f"machine: {machine()}; load average {load_avg:.1f}")
    print(f"state: {args.state_mb:.0f} MB as 8 tensors, local tier under {args.dir or tempfile.gettempdir()}, "
          f"{args.repeat} runs each, interleaved; every run bit-exact")
    print()
    print("| restore path | median s | best s | median / before |")
    print("| --- | ---: | ---: | ---: |")
    base = statistics.median(times[next(iter(rows))])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} | {min(values):.2f} | {median / base:.2f} |")
    print()
    print(f"The run manifest (sent at the first restore(); under the runner it was worked out inside restore(), "
          f"after its timing; a process started ahead now works it out while it waits): median "
          f"{statistics.median(manifest_s):.2f} s, best {min(manifest_s):.2f} s.")


if __name__ == "__main__":
    main()
