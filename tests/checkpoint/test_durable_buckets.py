"""The durable tier on object stores: the same behaviour on S3 (moto's server) and Cloud Storage (a fake
GCS JSON API), each reached through its real fsspec driver (s3fs, gcsfs) on loopback.

gcsfs is pointed at the fake the way a user points it at an emulator: ``STORAGE_EMULATOR_HOST`` for the
endpoint and fsspec's own configuration for anonymous credentials (``FSSPEC_GS_TOKEN=anon`` in a new
process; ``fsspec.config.conf`` in this one, which read its environment at import). gcsfs's default
class also asks the Storage Control gRPC API for each bucket's layout, which the fake does not speak,
so these tests use gcsfs's JSON-API class (``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` in a new process).
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import fsspec
import pytest

from runner.checkpoint import CheckpointConfigError, Checkpointer

from .conftest import run_trainee, same

FAKES = Path(__file__).resolve().parents[1] / "fakes"
if str(FAKES) not in sys.path:
    sys.path.insert(0, str(FAKES))

from gcs_api import FakeGCS  # noqa: E402


@dataclass
class Store:
    """One object store as the tests see it: its scheme, and direct access behind the driver's back."""

    scheme: str
    make_bucket: Callable[[], str]
    names: Callable[[str], list[str]]  # every object name in a bucket, sorted
    put: Callable[[str, str, bytes], None]


@pytest.fixture(scope="module")
def gcs():
    """The fake GCS, with this process and its children pointed at it as at an emulator."""
    pytest.importorskip("gcsfs")
    from gcsfs.core import GCSFileSystem

    with FakeGCS() as server, pytest.MonkeyPatch.context() as env:
        env.setenv("STORAGE_EMULATOR_HOST", server.endpoint)
        env.setenv("FSSPEC_GS_TOKEN", "anon")
        env.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        env.setitem(fsspec.config.conf, "gs", {"token": "anon"})
        previous = {p: fsspec.get_filesystem_class(p) for p in ("gs", "gcs")}
        for protocol in previous:
            fsspec.register_implementation(protocol, GCSFileSystem, clobber=True)
        try:
            yield server
        finally:
            for protocol, cls in previous.items():
                fsspec.register_implementation(protocol, cls, clobber=True)
            GCSFileSystem.clear_instance_cache()


def _gcs_store(server: FakeGCS) -> Store:
    def make_bucket() -> str:
        name = f"ckpt-{uuid.uuid4().hex[:10]}"
        server.objects[name] = {}
        return name

    def put(bucket: str, key: str, data: bytes) -> None:
        server.objects[bucket][key] = data

    return Store("gs", make_bucket, lambda bucket: sorted(server.objects[bucket]), put)


def _s3_store(endpoint: str) -> Store:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)

    def make_bucket() -> str:
        name = f"ckpt-{uuid.uuid4().hex[:10]}"
        client.create_bucket(Bucket=name)
        return name

    def names(bucket: str) -> list[str]:
        return sorted(obj["Key"] for obj in client.list_objects_v2(Bucket=bucket).get("Contents", []))

    return Store("s3", make_bucket, names, lambda bucket, key, data: client.put_object(Bucket=bucket, Key=key,
                                                                                        Body=data))


@pytest.fixture(params=["s3", "gs"])
def store(request) -> Store:
    if request.param == "s3":
        return _s3_store(request.getfixturevalue("s3_env"))
    return _gcs_store(request.getfixturevalue("gcs"))


def test_checkpoints_reach_the_bucket_with_the_manifest(setup, tmp_path, store):
    """After wait(), the bucket holds the data part, the state and the manifest."""
    bucket = store.make_bucket()
    with setup.checkpointer(tmp_path, durable_url=f"{store.scheme}://{bucket}/job") as ckpt:
        ckpt.save(7)
        assert ckpt.wait()
    assert store.names(bucket) == ["job/step-00000007/data-00000.bin", "job/step-00000007/manifest.json",
                                   "job/step-00000007/state.pkl"]


def test_a_new_node_restores_from_the_bucket(setup, make_setup, tmp_path, store):
    """An empty local folder restores the newest checkpoint from the bucket."""
    url = f"{store.scheme}://{store.make_bucket()}/job"
    with setup.checkpointer(tmp_path / "a", durable_url=url) as ckpt:
        ckpt.save(4)
    other = make_setup(seed=3)
    with other.checkpointer(tmp_path / "b", durable_url=url) as ckpt:
        assert ckpt.restore() == 4
    assert same(setup.weights(), other.weights())


def test_keep_applies_to_the_bucket(setup, tmp_path, store):
    """keep=1 leaves only the newest checkpoint in the bucket."""
    bucket = store.make_bucket()
    with setup.checkpointer(tmp_path, durable_url=f"{store.scheme}://{bucket}/job", keep=1) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step)
            ckpt.wait()
    assert {name.split("/")[1] for name in store.names(bucket)} == {"step-00000003"}


def test_an_unmanifested_upload_is_ignored(setup, make_setup, tmp_path, store):
    """An upload cut before its manifest (data present, no manifest) is not restored."""
    bucket = store.make_bucket()
    url = f"{store.scheme}://{bucket}/job"
    with setup.checkpointer(tmp_path / "a", durable_url=url) as ckpt:
        ckpt.save(1)
    store.put(bucket, "job/step-00000002/data-00000.bin", b"partial")
    other = make_setup(seed=3)
    with other.checkpointer(tmp_path / "b", durable_url=url) as ckpt:
        assert ckpt.restore() == 1


def test_a_missing_bucket_fails_at_construction(tmp_path, store):
    """A URL naming a bucket that does not exist is refused at construction."""
    with pytest.raises(CheckpointConfigError, match="does not exist"):
        Checkpointer(local_dir=tmp_path, durable_url=f"{store.scheme}://nobody-{uuid.uuid4().hex[:8]}/x")


def test_the_manifest_is_the_last_object_written(setup, tmp_path, gcs):
    """On GCS, whose fake records the order of finished uploads, the manifest lands after the data."""
    store = _gcs_store(gcs)
    bucket = store.make_bucket()
    with setup.checkpointer(tmp_path, durable_url=f"gs://{bucket}/job") as ckpt:
        ckpt.save(7)
        assert ckpt.wait()
    written = [w for w in gcs.writes if w.startswith(f"{bucket}/")]
    assert written[-1] == f"{bucket}/job/step-00000007/manifest.json"


def test_a_training_process_configured_by_environment_resumes_from_gcs(tmp_path, gcs, reference_hashes):
    """A second training process, on an empty local folder, resumes bit-exactly from what the first left on gs://."""
    url = f"gs://{_gcs_store(gcs).make_bucket()}/trainee"
    run_trainee("--steps", "20", "--every-steps", "10", "--local-dir", str(tmp_path / "a"), "--durable-url", url,
                cwd=tmp_path)
    second = run_trainee("--steps", "20", "--local-dir", str(tmp_path / "b"), "--durable-url", url, cwd=tmp_path)
    assert second[0] == f"ready 20 {reference_hashes[20]}"


def test_an_unreachable_s3_endpoint_is_named_as_such_not_as_a_missing_bucket(tmp_path, monkeypatch):
    """An endpoint nobody listens on fails at construction saying the store cannot be reached."""
    import socket

    s3fs = pytest.importorskip("s3fs")
    s3fs.S3FileSystem.clear_instance_cache()  # an instance cached by an earlier test would know moto's endpoint
    with socket.socket() as sock:  # a port that was free a moment ago: connections to it are refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    try:
        with pytest.raises(CheckpointConfigError) as error:
            Checkpointer(local_dir=tmp_path, durable_url=f"s3://bucket-{uuid.uuid4().hex[:8]}/job")
    finally:
        s3fs.S3FileSystem.clear_instance_cache()  # later tests must not get this endpoint's filesystem
    assert "cannot be reached" in str(error.value) and "does not exist" not in str(error.value)
