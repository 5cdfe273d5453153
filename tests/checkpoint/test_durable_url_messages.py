"""The checkpoint library's messages and logs name its durable URL with the URL's credentials as ``***``: the
errors a user's training script raises (a traceback included), and the lines a failed upload and a restore log."""

from __future__ import annotations

import socket
import traceback
from pathlib import Path

import pytest
import torch

from runner.checkpoint import CheckpointConfigError, Checkpointer

SECRET = "pw-91c4e07b"


def _closed_port() -> int:
    with socket.socket() as probe:  # bound, never listening: a connection to it is refused
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_store_that_refuses_the_connection_is_named_without_its_password():
    """ftp://user:PASSWORD@host/... that cannot be reached: the error (and its traceback) shows ``user:***@``."""
    port = _closed_port()
    with pytest.raises(CheckpointConfigError) as caught:
        Checkpointer(model=torch.nn.Linear(2, 2), durable_url=f"ftp://trainer:{SECRET}@127.0.0.1:{port}/ckpt")
    message = str(caught.value)
    assert f"ftp://trainer:***@127.0.0.1:{port}/ckpt" in message and "cannot be opened" in message
    assert SECRET not in "".join(traceback.format_exception(caught.value))


def test_a_failed_upload_and_a_restore_name_the_url_with_its_token_hidden(tmp_path: Path, capfd):
    """A token kept as a query parameter of the URL reaches the store as written, yet the failed upload's log line
    and error and the restore's log line show ``token=***``."""
    durable = tmp_path / f"durable?token={SECRET}"
    url = f"local-durable://{tmp_path}/durable?token={SECRET}"
    model = torch.nn.Linear(2, 2)
    ckpt = Checkpointer(model=model, local_dir=tmp_path / "local", durable_url=url)
    ckpt.restore()
    ckpt.save(1)
    ckpt.wait()
    (durable / "step-00000002").write_text("a file where the step's folder goes")
    ckpt.save(2)
    ckpt.wait()
    ckpt.close()
    assert (durable / "step-00000001" / "manifest.json").is_file()
    assert Checkpointer(model=model, local_dir=tmp_path / "fresh", durable_url=url).restore() == 1
    logged = "".join(capfd.readouterr())
    assert "checkpoint not uploaded" in logged and "restored checkpoint" in logged
    assert f"{tmp_path}/durable?token=***/step-00000002" in logged
    assert SECRET not in logged
