"""A durable tier that hangs: an fsspec filesystem (``hangtest://``) whose operations block while told to.

It keeps its files in memory (fsspec's memory filesystem). ``HangingStore.hang()`` makes every later call
block until ``release()``; ``hang_after_manifest()`` does the same from the moment a checkpoint's manifest
has been written (the checkpoint is committed, then the store stops answering); ``hang_uploads()`` blocks only
the file transfers to the store (``put_file``, ``pipe_file``), its listings still answer.
"""

from __future__ import annotations

import threading

import fsspec
from fsspec.implementations.memory import MemoryFileSystem

PROTOCOL = "hangtest"


class HangingStore(MemoryFileSystem):
    protocol = PROTOCOL
    store: dict = {}
    pseudo_dirs = [""]
    _hanging = threading.Event()
    _released = threading.Event()
    _after_manifest = threading.Event()
    _uploads_only = threading.Event()
    blocked = threading.Event()  # set once a call has blocked

    @classmethod
    def reset(cls) -> None:
        cls.store.clear()
        cls.pseudo_dirs[:] = [""]
        for event in (cls._hanging, cls._released, cls._after_manifest, cls._uploads_only, cls.blocked):
            event.clear()

    @classmethod
    def hang(cls) -> None:
        cls._hanging.set()

    @classmethod
    def hang_uploads(cls) -> None:
        cls._uploads_only.set()
        cls._hanging.set()

    @classmethod
    def hang_after_manifest(cls) -> None:
        cls._after_manifest.set()

    @classmethod
    def release(cls) -> None:
        cls._released.set()

    def _gate(self, upload: bool = False) -> None:
        if self._uploads_only.is_set() and not upload:
            return
        if self._hanging.is_set() and not self._released.is_set():
            self.blocked.set()
            self._released.wait()

    def pipe_file(self, path, value, *args, **kwargs):
        self._gate(upload=True)
        out = super().pipe_file(path, value, *args, **kwargs)
        if str(path).endswith("manifest.json") and self._after_manifest.is_set():
            self._hanging.set()
        return out

    def put_file(self, *args, **kwargs):
        self._gate(upload=True)
        return super().put_file(*args, **kwargs)

    def ls(self, *args, **kwargs):
        self._gate()
        return super().ls(*args, **kwargs)

    def rm_file(self, *args, **kwargs):
        self._gate()
        return super().rm_file(*args, **kwargs)

    def rm(self, *args, **kwargs):
        self._gate()
        return super().rm(*args, **kwargs)

    def cat_file(self, *args, **kwargs):
        self._gate()
        return super().cat_file(*args, **kwargs)

    def exists(self, *args, **kwargs):
        self._gate()
        return super().exists(*args, **kwargs)

    def makedirs(self, *args, **kwargs):
        self._gate()
        return super().makedirs(*args, **kwargs)


fsspec.register_implementation(PROTOCOL, HangingStore, clobber=True)
