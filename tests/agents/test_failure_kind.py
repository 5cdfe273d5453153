"""Telling a failure no relaunch can fix from the exit code and the output's last lines (agents/failure_kind.py)."""

from __future__ import annotations

from agents.failure_kind import TAIL_BYTES, OutputTail, classify
from runner.protocol.events import FailureKind

TRACEBACK = 'Traceback (most recent call last):\n  File "train.py", line 1, in <module>\n'


def test_exit_127_is_a_command_not_found_naming_the_shell_s_line():
    kind, message = classify(127, "starting\nbash: line 1: trian.py: command not found\n")
    assert kind == FailureKind.COMMAND_NOT_FOUND
    assert message == "command not found (exit 127): bash: line 1: trian.py: command not found"


def test_a_traceback_ending_in_a_missing_module_is_an_import_error():
    tail = TRACEBACK + "    import flash_attn\nModuleNotFoundError: No module named 'flash_attn'\n"
    kind, message = classify(1, tail)
    assert kind == FailureKind.IMPORT_ERROR and "No module named 'flash_attn'" in message and "exit 1" in message


def test_a_cuda_out_of_memory_names_the_memory_in_use_and_the_device_s():
    tail = TRACEBACK + ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                        "capacity of 79.19 GiB of which 1.2 GiB is free. Including non-PyTorch memory, this process "
                        "has 77.90 GiB memory in use.\n")
    kind, message = classify(1, tail)
    assert kind == FailureKind.CUDA_OOM and "77.90 GiB in use of the device's 79.19 GiB" in message


def test_other_failures_and_an_import_error_caught_before_another_exception_are_left_to_relaunch():
    assert classify(1, TRACEBACK + "RuntimeError: NCCL timeout\n") is None
    handled = TRACEBACK + "ImportError: no apex\nfalling back\n" + TRACEBACK + "ValueError: bad shape\n"
    assert classify(1, handled) is None
    assert classify(0, "bash: x: command not found\n") is None and classify(None, "") is None
    assert classify(137, "Killed\n") is None


def test_the_tail_passes_every_byte_on_and_keeps_only_the_last_ones():
    class Sink:
        data = b""

        def write(self, data):
            Sink.data += data

    tail = OutputTail(Sink())
    for _ in range(100):
        tail.write(b"x" * 1000)
    tail.write(b"\nModuleNotFoundError: No module named 'y'\n")
    assert len(Sink.data) == 100_000 + 42 and len(tail.text()) == TAIL_BYTES
    assert tail.text().endswith("No module named 'y'\n")


def test_a_checkpoint_that_does_not_fit_the_model_is_a_mismatch_and_a_full_disk_is_left_to_relaunch():
    mismatch = TRACEBACK + ("runner.checkpoint.errors.RestoreError: /ckpt/step-00000040/manifest.json: "
                            "model.load_state_dict failed (size mismatch for weight)\n")
    kind, message = classify(1, mismatch)
    assert kind == FailureKind.CHECKPOINT_MISMATCH
    assert message.startswith("the checkpoint does not fit the job's model (exit 1): ") and "size mismatch" in message
    full_disk = TRACEBACK + ("runner.checkpoint.errors.NoRoomToRestoreError: step 40 of s3://b/j cannot be fetched "
                             "into /ckpt: No space left on device\n")
    assert classify(1, full_disk) is None  # another node, with room, resumes from the same checkpoint


def test_a_torchrun_worker_s_failure_is_read_past_the_launcher_s_own_lines():
    """torchrun prefixes its workers' output with their rank and ends with its own ChildFailedError report."""
    tail = ("[rank1]: Traceback (most recent call last):\n[rank1]:   File \"train.py\", line 3, in <module>\n"
            "[rank1]: ModuleNotFoundError: No module named 'flash_attn'\n"
            "Traceback (most recent call last):\n  File \"/venv/bin/torchrun\", line 8, in <module>\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            "============================================================\ntrain.py FAILED\n"
            "  exitcode  : 1 (pid: 4242)\n")
    kind, message = classify(1, tail)
    assert kind == FailureKind.IMPORT_ERROR and "No module named 'flash_attn'" in message
