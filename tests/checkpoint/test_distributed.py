"""The collective Checkpointer under torchrun (gloo, CPU): one checkpoint and one stop step for every rank."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from .torchrun_launch import TIMEOUT, run_ranks

TRAINEE = Path(__file__).with_name("ddp_trainee.py")
# Minutes of torchrun gangs, on one worker (the module's tests share a fixture): started early, not at the run's tail.
pytestmark = pytest.mark.start_early("four-rank torchrun gangs, one after another")


def torchrun(ranks: int, *args, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return run_ranks(ranks, TRAINEE, *args, check=check, env=env)


def reports(prefix: Path, ranks: int) -> list[dict]:
    return [json.loads(Path(f"{prefix}.{rank}.json").read_text()) for rank in range(ranks)]


def same_weights(a: Path, b: Path) -> bool:
    left, right = torch.load(a), torch.load(b)
    return sorted(left) == sorted(right) and all(torch.equal(left[k], right[k]) for k in left)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """Final weights of a 2-rank DDP run of 30 steps that nothing interrupts."""
    where = tmp_path_factory.mktemp("uninterrupted")
    torchrun(2, "--steps", 30, "--local-dir", where / "local", "--every-steps", 10, "--out", where / "w.pt")
    return where / "w.pt"


FOUR_RANK_DDP = ["--steps", 16, "--width", 4096, "--every-steps", 4]


@pytest.fixture(scope="module")
def four_rank_ddp(tmp_path_factory) -> Path:
    """A 4-rank default-DDP run of 16 steps that nothing interrupts, wide enough that its weights and Adam's state
    outweigh a checkpoint's small items: its local checkpoints, and its final weights in ``whole.pt``."""
    where = tmp_path_factory.mktemp("four-rank-ddp")
    torchrun(4, *FOUR_RANK_DDP, "--local-dir", where / "local", "--out", where / "whole.pt")
    return where


@pytest.fixture(scope="module")
def four_rank_ddp_resumed(tmp_path_factory) -> SimpleNamespace:
    """The same 4-rank run with both tiers, SIGTERM to rank 1 alone before step 6's ``ckpt.step``, then resumed
    to its end: each rank's report of the first run (``first``) and of the second (``second``), the durable
    folder (``durable``) and the resumed run's final weights (``weights``)."""
    where = tmp_path_factory.mktemp("four-rank-ddp-resumed")
    common = [*FOUR_RANK_DDP, "--local-dir", where / "local", "--durable-url", (where / "durable").as_uri()]
    torchrun(4, *common, "--report", where / "first", "--signal-self", "1:6")
    torchrun(4, *common, "--report", where / "second", "--out", where / "resumed.pt")
    return SimpleNamespace(first=reports(where / "first", 4), second=reports(where / "second", 4),
                           durable=where / "durable", weights=where / "resumed.pt")


def test_sigterm_to_one_rank_stops_every_rank_at_one_step_and_resumes_bit_exact(four_rank_ddp_resumed,
                                                                                  four_rank_ddp):
    """SIGTERM to rank 1 alone: every rank stops at the same step with it committed to the durable tier as an
    emergency checkpoint; the resumed run restores that step on every rank and ends with the weights of the
    uninterrupted one."""
    first = four_rank_ddp_resumed.first
    assert [r["should_stop"] for r in first] == [True] * 4
    assert len({r["step"] for r in first}) == 1 and first[0]["step"] < 16
    stop = first[0]["step"]
    manifest = json.loads((four_rank_ddp_resumed.durable / f"step-{stop:08d}" / "manifest.json").read_text())
    assert manifest["emergency"] and manifest["layout"] == "dcp" and manifest["world_size"] == 4
    assert [r["restored"] for r in four_rank_ddp_resumed.second] == [stop] * 4
    assert same_weights(four_rank_ddp_resumed.weights, four_rank_ddp / "whole.pt")


def test_four_rank_default_ddp_resumes_bit_exact(four_rank_ddp_resumed, four_rank_ddp):
    """With DistributedDataParallel's default buckets, 4 gloo ranks stopped at step 6 and resumed end with
    exactly the weights of an uninterrupted run: the resumed DDP reduces with the buckets the saved one had
    (its first backward would otherwise sum in another order, and the last bits differ)."""
    stop = four_rank_ddp_resumed.first[0]["step"]
    assert stop % 4 and stop < 16  # an emergency checkpoint between the periodic ones
    assert [r["restored"] for r in four_rank_ddp_resumed.second] == [stop] * 4
    assert same_weights(four_rank_ddp_resumed.weights, four_rank_ddp / "whole.pt")


def test_sigterm_to_torchrun_stops_every_rank_at_one_step(tmp_path):
    """SIGTERM to the launcher reaches every worker; all stop at one step, committed, and torchrun ends."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(TRAINEE),
               "--steps", "60", "--local-dir", str(tmp_path / "local"), "--every-steps", "50",
               "--report", str(tmp_path / "r"), "--pause-for-sigterm", "7"]
    launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"})
    try:
        paused = tmp_path / "r.paused"
        _wait_for_file(paused, launcher)
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(TIMEOUT)
    finally:
        launcher.kill()
    done = reports(tmp_path / "r", 2)
    assert [r["should_stop"] for r in done] == [True, True]
    assert done[0]["step"] == done[1]["step"] > 7
    assert (tmp_path / "local" / f"step-{done[0]['step']:08d}" / "manifest.json").is_file()


def _wait_for_file(path: Path, process: subprocess.Popen) -> None:
    """Wait until ``path`` exists (the trainee writes it), failing early if the process ends first."""
    import time

    end = time.monotonic() + TIMEOUT
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"torchrun ended ({process.returncode}) before {path.name}: "
                                 f"{process.stderr.read()[-3000:]}")
        assert time.monotonic() < end, f"{path.name} never appeared"
        time.sleep(0.05)


def test_a_four_rank_ddp_checkpoint_is_written_once(four_rank_ddp):
    """Replicated DDP state is deduplicated: four ranks write about one copy of the model and optimizer."""
    folder = four_rank_ddp / "local" / "step-00000016"
    data = sum(p.stat().st_size for p in folder.glob("*.distcp"))
    params = (8 * 4096 + 4096 + 4096 * 2 + 2) * 4  # float32 weights and biases
    one_copy = 3 * params  # the weights, Adam's exp_avg and exp_avg_sq
    assert one_copy <= data < 1.5 * one_copy
    assert len(list(folder.glob("__*_0.distcp"))) >= 2  # the writing is shared out, not all on rank 0


FSDP_ON_TWO_NODES = ["--fsdp", "--width", 256, "--every-steps", 4, "--counting-store"]


@pytest.fixture(scope="module")
def fsdp_on_two_nodes(tmp_path_factory) -> SimpleNamespace:
    """A 4-rank FSDP2 job on two "nodes" (a local folder per two ranks) trained 8 steps, every rank told of one
    agent socket here as an attempt's processes are: its durable tier (``durable``, a URL that counts the files
    fetched from it), the folder of that tier (``stored``), the final full weights (``saved``) and the messages
    the agent socket received (``messages``)."""
    from agents.control import ControlServer

    where = tmp_path_factory.mktemp("fsdp-two-nodes")
    durable = f"countingfile://{where / 'durable'}"
    messages: list[dict] = []
    server = ControlServer(where / "control.sock", messages.append).start()
    try:
        torchrun(4, *FSDP_ON_TWO_NODES, "--durable-url", durable, "--ranks-per-node", 2, "--steps", 8,
                 "--local-dir", where / "old", "--out", where / "saved.pt",
                 env={"RUNNER_CONTROL": str(where / "control.sock"), "RUNNER_ATTEMPT": "1", "RUNNER_JOB_ID": "job-1"})
        server.drain()
    finally:
        server.close()
    return SimpleNamespace(durable=durable, stored=where / "durable", saved=where / "saved.pt", messages=messages)


def test_fsdp2_state_reshards_from_four_ranks_to_two_and_one(tmp_path, fsdp_on_two_nodes):
    """An FSDP2 checkpoint of 4 ranks restores onto 2 ranks and onto 1 with equal full weights."""
    for ranks in (2, 1):
        torchrun(ranks, *FSDP_ON_TWO_NODES, "--steps", 8, "--local-dir", tmp_path / f"l{ranks}",
                 "--durable-url", fsdp_on_two_nodes.durable, "--dump-full", tmp_path / f"w{ranks}.pt")
        assert same_weights(tmp_path / f"w{ranks}.pt", fsdp_on_two_nodes.saved)


def test_a_rank_killed_mid_save_leaves_that_step_uncommitted_and_the_previous_intact(tmp_path):
    """Rank 1 dies after writing its share of step 10: step 10 never commits, and a restart resumes from 5."""
    common = ["--steps", 20, "--local-dir", tmp_path / "local", "--durable-url", (tmp_path / "durable").as_uri(),
              "--every-steps", 5]
    died = torchrun(2, *common, "--die-mid-save", "1:10", check=False)
    assert died.returncode != 0
    for tier in ("local", "durable"):
        assert not (tmp_path / tier / "step-00000010" / "manifest.json").exists()
    assert (tmp_path / "local" / "step-00000005" / "manifest.json").is_file()
    torchrun(2, *common, "--report", tmp_path / "again")
    assert [r["restored"] for r in reports(tmp_path / "again", 2)] == [5, 5]


def test_ranks_that_register_different_objects_get_an_error_naming_both(tmp_path):
    """Rank 1 leaves out the optimizer: every rank fails at construction with both setups named."""
    done = torchrun(2, "--steps", 2, "--local-dir", tmp_path / "local", "--mismatch", check=False)
    assert done.returncode != 0
    assert "rank 1 built its Checkpointer with (model=" in done.stderr + done.stdout
    assert "optimizer=Adam" in done.stderr + done.stdout


def test_a_single_process_restores_a_checkpoint_of_two_ranks(uninterrupted):
    """A plain process (no process group) restores the 2-rank DDP checkpoint: the weights rank 0 wrote."""
    sys.path.insert(0, str(TRAINEE.parent))
    from ddp_trainee import parse

    from runner.checkpoint import Checkpointer, ResumableSampler

    args = parse(["--steps", "1", "--local-dir", str(uninterrupted.parent / "local")])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, args.width), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(args.width, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    with Checkpointer(model=model, optimizer=optimizer, sampler=ResumableSampler(96, seed=3),
                      local_dir=args.local_dir) as ckpt:
        assert ckpt.restore() == 30
    final = torch.load(uninterrupted)
    assert all(torch.equal(model.state_dict()[k], final[k]) for k in final)


def test_each_node_fetches_only_its_own_ranks_shards_once_and_verifies_them(tmp_path, fsdp_on_two_nodes):
    """A 4-rank FSDP2 job on two "nodes" (a local folder per two ranks) resumes on two new nodes: each node
    downloads the checkpoint's metadata and the shards its own ranks read, each once, not the other node's."""
    common = [*FSDP_ON_TWO_NODES, "--durable-url", fsdp_on_two_nodes.durable, "--ranks-per-node", 2]
    fetch_log = tmp_path / "fetches.jsonl"
    os.environ["RUNNER_TEST_FETCH_LOG"] = str(fetch_log)
    try:
        torchrun(4, *common, "--steps", 8, "--local-dir", tmp_path / "new", "--dump-full", tmp_path / "restored.pt")
    finally:
        del os.environ["RUNNER_TEST_FETCH_LOG"]
    assert same_weights(fsdp_on_two_nodes.saved, tmp_path / "restored.pt")
    fetched = [json.loads(line) for line in fetch_log.read_text().splitlines()]
    by_node = {node: sorted(Path(f["target"]).name for f in fetched if f"/new/{node}/" in f["target"])
               for node in ("node0", "node1")}
    # Rank 0's file also holds the small replicated items (Adam's step counters) that every rank reads.
    assert by_node == {"node0": [".metadata", "__0_0.distcp", "__1_0.distcp"],
                       "node1": [".metadata", "__0_0.distcp", "__2_0.distcp", "__3_0.distcp"]}, by_node
    stored = {p.name: p.stat().st_size for p in (fsdp_on_two_nodes.stored / "step-00000008").iterdir()}
    for node, not_needed in (("node0", ["__2_0.distcp", "__3_0.distcp"]), ("node1", ["__1_0.distcp"])):
        got = sum(f["bytes"] for f in fetched if f"/new/{node}/" in f["target"])
        whole = sum(size for name, size in stored.items() if name != "manifest.json")
        assert got == whole - sum(stored[name] for name in not_needed)


def test_each_nodes_first_process_tells_its_own_agent_how_long_a_commit_took(fsdp_on_two_nodes):
    """Four ranks on two "nodes" (a local folder per two ranks), one agent socket here: every commit of each tier
    reaches the agents twice, once to report (the job's first rank) and once timing only (the other node's first
    process), with the same step, so a notice on either node knows how long its emergency checkpoint takes; the
    nodes' other ranks send none."""
    messages = fsdp_on_two_nodes.messages
    commits = [(m["step"], m["durable"], m["timing_only"]) for m in messages if m["op"] == "committed"]
    expected = [(step, durable, timing_only) for step in (4, 8) for durable in (False, True)
                for timing_only in (False, True)]
    assert sorted(commits) == expected
    assert all(m["seconds"] > 0 for m in messages if m["op"] == "committed")


def test_a_model_changed_since_the_checkpoint_fails_the_restore_naming_the_mismatch(tmp_path, uninterrupted):
    """Resumed with a wider model than the one saved, every rank's restore() raises the library's RestoreError
    naming the tensor whose size changed and what to do (not DCP's gathered tracebacks of every rank)."""
    shutil.copytree(uninterrupted.parent / "local", tmp_path / "local")
    resumed = torchrun(2, "--local-dir", tmp_path / "local", "--steps", 40, "--width", 24, check=False)
    assert resumed.returncode != 0
    output = resumed.stdout + resumed.stderr
    assert "RestoreError" in output and "Size mismatch" in output
    assert "Register the same model and optimizer as the run that saved it" in output
    assert "CheckpointException" not in output
