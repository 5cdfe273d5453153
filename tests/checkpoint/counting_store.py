"""A durable tier on the local disk that records every file fetched from it (``countingfile:///abs/path``).

Each ``get_file`` appends one JSON line ``{"source", "target", "bytes"}`` to the file named by
``RUNNER_TEST_FETCH_LOG``, so a test can count what each node downloaded, whatever process did it.
"""

from __future__ import annotations

import json
import os

import fsspec
from fsspec.implementations.local import LocalFileSystem

PROTOCOL = "countingfile"


class CountingStore(LocalFileSystem):
    protocol = PROTOCOL

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        if path.startswith(f"{PROTOCOL}://"):
            path = path[len(PROTOCOL) + 3:]
        return super()._strip_protocol(path)

    def get_file(self, path1, path2, *args, **kwargs):
        result = super().get_file(path1, path2, *args, **kwargs)
        log = os.environ.get("RUNNER_TEST_FETCH_LOG")
        if log:
            line = json.dumps({"source": str(path1), "target": str(path2), "bytes": os.path.getsize(path2)})
            with open(log, "a") as f:  # one short line per write: appends from several processes stay whole
                f.write(line + "\n")
        return result


def register() -> None:
    fsspec.register_implementation(PROTOCOL, CountingStore, clobber=True)
