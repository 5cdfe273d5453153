"""The fake Cloud Storage JSON API answers the real gcsfs client as GCS does, for the calls the runner makes."""

from __future__ import annotations

import base64
import hashlib
import sys
from pathlib import Path

import pytest

FAKES = Path(__file__).resolve().parents[2] / "fakes"
if str(FAKES) not in sys.path:
    sys.path.insert(0, str(FAKES))

from gcs_api import FakeGCS  # noqa: E402

gcsfs_core = pytest.importorskip("gcsfs.core")
KIB = 1024


@pytest.fixture
def gcs():
    with FakeGCS(buckets=("bkt",)) as server:
        yield server


@pytest.fixture
def fs(gcs):
    """gcsfs's JSON-API filesystem, anonymous, at the fake's endpoint (no instance shared between tests)."""
    return gcsfs_core.GCSFileSystem(endpoint_url=gcs.endpoint, token="anon", skip_instance_cache=True)


def test_an_object_written_reads_back_with_its_size_and_md5(fs):
    """A small upload reads back byte for byte, and its metadata carries GCS's size and base64 MD5."""
    fs.pipe_file("bkt/a/b.bin", b"hello world")
    info = fs.info("bkt/a/b.bin")
    assert fs.cat_file("bkt/a/b.bin") == b"hello world"
    assert info["size"] == 11 and info["type"] == "file"
    assert info["md5Hash"] == base64.b64encode(hashlib.md5(b"hello world").digest()).decode()


def test_a_listing_shows_objects_and_prefixes_as_folders(fs):
    """Listing a prefix gives its objects as files and deeper prefixes as directories."""
    for name in ("run/step-1/manifest.json", "run/step-2/data.bin", "run/top.txt"):
        fs.pipe_file(f"bkt/{name}", b"x")
    listing = {entry["name"]: entry["type"] for entry in fs.ls("bkt/run", detail=True)}
    assert listing == {"bkt/run/step-1": "directory", "bkt/run/step-2": "directory", "bkt/run/top.txt": "file"}


def test_a_large_write_goes_through_a_resumable_upload_in_chunks(fs, gcs):
    """A write larger than the block size is uploaded in resumable chunks and arrives intact."""
    data = bytes(range(256)) * (3 * KIB)  # 768 KiB
    with fs.open("bkt/big.bin", "wb", block_size=256 * KIB) as handle:
        for start in range(0, len(data), 100 * KIB):
            handle.write(data[start:start + 100 * KIB])
    assert gcs.objects["bkt"]["big.bin"] == data


def test_a_ranged_read_returns_only_the_requested_bytes(fs):
    """cat_file with start and end reads that range of the object."""
    fs.pipe_file("bkt/r.bin", bytes(range(100)))
    assert fs.cat_file("bkt/r.bin", start=10, end=20) == bytes(range(10, 20))


def test_a_missing_object_is_file_not_found(fs):
    """Reading an object that does not exist raises FileNotFoundError, as against GCS."""
    with pytest.raises(FileNotFoundError):
        fs.cat_file("bkt/nothing-here")


def test_a_missing_bucket_does_not_exist(fs):
    """A bucket the fake does not hold does not exist, while a held one does."""
    assert fs.exists("bkt")
    assert not fs.exists("no-such-bucket")


def test_a_recursive_remove_deletes_every_object_under_the_prefix(fs, gcs):
    """rm(recursive=True) deletes the prefix's objects and leaves the others."""
    for name in ("gone/1", "gone/sub/2", "kept/3"):
        fs.pipe_file(f"bkt/{name}", b"x")
    fs.rm("bkt/gone", recursive=True)
    assert sorted(gcs.objects["bkt"]) == ["kept/3"]
