"""The durable tier on S3, against moto's S3 server on loopback, through s3fs."""

from __future__ import annotations

import uuid

import boto3
import pytest

from runner.checkpoint import CheckpointConfigError, Checkpointer

from .conftest import same


@pytest.fixture
def bucket(s3_env):
    name = f"ckpt-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket=name)
    return name


def _keys(endpoint, bucket):
    listing = boto3.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket=bucket)
    return sorted(obj["Key"] for obj in listing.get("Contents", []))


def test_checkpoints_reach_s3_with_the_manifest(setup, tmp_path, bucket, s3_env):
    """After wait(), the bucket holds the data parts, the state and the manifest."""
    with setup.checkpointer(tmp_path, durable_url=f"s3://{bucket}/job") as ckpt:
        ckpt.save(7)
        assert ckpt.wait()
    assert _keys(s3_env, bucket) == ["job/step-00000007/data-00000.bin", "job/step-00000007/manifest.json",
                                     "job/step-00000007/state.pkl"]


def test_a_new_node_restores_from_s3(setup, make_setup, tmp_path, bucket):
    """An empty local folder restores the newest checkpoint from S3."""
    url = f"s3://{bucket}/job"
    with setup.checkpointer(tmp_path / "a", durable_url=url) as ckpt:
        ckpt.save(4)
    other = make_setup(seed=3)
    with other.checkpointer(tmp_path / "b", durable_url=url) as ckpt:
        assert ckpt.restore() == 4
    assert same(setup.weights(), other.weights())


def test_keep_applies_to_s3(setup, tmp_path, bucket, s3_env):
    """keep=1 leaves only the newest checkpoint in the bucket."""
    with setup.checkpointer(tmp_path, durable_url=f"s3://{bucket}/job", keep=1) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step)
            ckpt.wait()
    assert {key.split("/")[1] for key in _keys(s3_env, bucket)} == {"step-00000003"}


def test_an_unmanifested_upload_on_s3_is_ignored(setup, make_setup, tmp_path, bucket, s3_env):
    """An upload cut before its manifest (data present, no manifest) is not restored."""
    url = f"s3://{bucket}/job"
    with setup.checkpointer(tmp_path / "a", durable_url=url) as ckpt:
        ckpt.save(1)
    boto3.client("s3", endpoint_url=s3_env).put_object(Bucket=bucket, Key="job/step-00000002/data-00000.bin",
                                                       Body=b"partial")
    other = make_setup(seed=3)
    with other.checkpointer(tmp_path / "b", durable_url=url) as ckpt:
        assert ckpt.restore() == 1


def test_a_missing_bucket_fails_at_construction(tmp_path, s3_env):
    """An s3:// URL naming a bucket that does not exist is refused at construction."""
    with pytest.raises(CheckpointConfigError, match="does not exist"):
        Checkpointer(local_dir=tmp_path, durable_url=f"s3://nobody-{uuid.uuid4().hex[:8]}/x")
