"""The checkpoint of a process group, in torch.distributed.checkpoint (DCP) files.

What goes in, per registered object:

* an ``nn.Module`` (plain, DDP or FSDP2): ``get_model_state_dict``, keyed by parameter name without
  wrapper prefixes, so replicated tensors are written once (DCP's dedup) and sharded DTensors by the
  ranks that own them, and either loads onto another number of ranks (DCP reshards);
* an optimizer whose parameters belong to a registered module: ``get_optimizer_state_dict``, keyed by
  parameter name, resharded likewise (before its first step it has no state, and is kept as a plain
  object instead: asking DCP for it would take a zero-learning-rate step to create one);
* anything else (schedulers, samplers, scalers, ``extra``, this rank's RNG states and each DDP's gradient
  bucket layout, ddp_buckets.py): one small blob
  per rank, ``__runner__.rank<N>``, serialised with ``torch.save`` and read back with ``weights_only=True``.
  At the same world size each rank loads its own; at another, every rank loads rank 0's and RNG states
  are left as they are.

Reading never unpickles code: DCP's ``.metadata`` goes through an unpickler that knows only DCP's own
metadata classes, and byte items through ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import pickle
import queue
import warnings
from pathlib import Path

import torch
from torch import nn

from . import dcp_read, ddp_buckets, rng
from .checksum import file_digest
from .errors import CorruptCheckpointError, RestoreError

METADATA_NAME = ".metadata"
READ_DIRECT = hasattr(os, "preadv")  # tensors read straight into the restored ones (dcp_read.py); False: DCP's reader
BLOB_PREFIX = "__runner__.rank"


def _dcp():
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import state_dict as dsd

    return dcp, dsd


# ------------------------------------------------------------------ which object goes where

def optimizer_owners(objects: dict) -> dict[str, str]:
    """For each registered optimizer, the registered module holding all of its parameters."""
    modules = {name: {id(p) for p in obj.parameters()} for name, obj in objects.items() if isinstance(obj, nn.Module)}
    owners = {}
    for name, obj in objects.items():
        if isinstance(obj, torch.optim.Optimizer):
            params = {id(p) for group in obj.param_groups for p in group["params"]}
            for module_name, module_params in modules.items():
                if params and params <= module_params:
                    owners[name] = module_name
                    break
    return owners


def capture(objects: dict, extra: dict, rank: int) -> dict:
    """The state dict DCP saves for this rank (tensors still where they live; ``stage`` copies them)."""
    _, dsd = _dcp()
    owners = optimizer_owners(objects)
    state, plain = {}, {}
    for name, obj in objects.items():
        if isinstance(obj, nn.Module):
            state[name] = dsd.get_model_state_dict(obj)
        elif name in owners and obj.state:
            state[name] = dsd.get_optimizer_state_dict(objects[owners[name]], obj)
        else:
            plain[name] = obj.state_dict()
    blob = {"objects": plain, "extra": dict(extra), "rng": rng.portable(rng.capture()),
            "ddp_buckets": ddp_buckets.record(objects)}
    buffer = io.BytesIO()
    torch.save(blob, buffer)
    state[f"{BLOB_PREFIX}{rank}"] = buffer.getvalue()  # bytes: DCP writes them as one byte item of this rank
    return state


class Stager:
    """Copies a DCP state dict to host memory that is kept and reused while its layout stays the same
    (pinned when CUDA tensors are staged), using DCP's own staging helpers (DTensors stay DTensors).

    ``ranks`` (a callable: this rank and the world's size, read at each save: an elastic gang's world changes):
    a replicated state (DDP: every rank holds all of it) is staged only in the part this rank writes
    (:func:`owned_part`), not whole on every rank: on a node of eight GPUs that is an eighth of the host memory
    and of the copies from the devices."""

    def __init__(self, ranks=None) -> None:
        self._cache = None
        self._layout = None
        self._ranks = ranks

    def stage(self, state: dict) -> dict:
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        blobs = {k: v for k, v in state.items() if isinstance(v, bytes)}
        tensors = {k: v for k, v in state.items() if k not in blobs}
        if self._ranks is not None and replicated(tensors):
            rank, world = self._ranks()
            tensors = owned_part(tensors, rank, world)
        layout = _layout_of(tensors)
        on_cuda = torch.cuda.is_available() and any(t.is_cuda for t in _tensors(tensors))
        if self._cache is None or layout != self._layout:
            self._cache = None
            self._cache = _create_cpu_state_dict(tensors, pin_memory=on_cuda)
            self._layout = layout
        staged = _copy_state_dict(tensors, self._cache, non_blocking=on_cuda)
        if on_cuda:  # the copies were queued; the training may change its tensors once they are done
            torch.cuda.synchronize()
        staged.update(blobs)
        return staged


def owned_part(state: dict, rank: int, world: int) -> dict:
    """The part of a replicated ``state`` that ``rank`` writes: every tensor held in a dict is written by one rank,
    the same on every rank (they hold the same layout): one smaller than SMALL_REPLICATED_BYTES by rank 0 (as the
    save planner places them), larger ones spread by size, each to the rank with the fewest bytes so far. The rest
    (tensors inside lists, everything that is not a tensor) stays on every rank, for DCP's own dedup."""
    if world <= 1:
        return state
    held = list(_dict_tensors(state, ()))
    owner = {path: 0 for path, tensor in held if _nbytes(tensor) < SMALL_REPLICATED_BYTES}
    load = [0] * world
    large = sorted(((path, _nbytes(tensor)) for path, tensor in held if path not in owner),
                   key=lambda item: -item[1])  # stable: equal sizes keep the state's order
    for path, nbytes in large:
        least = min(range(world), key=lambda r: (load[r], r))
        owner[path] = least
        load[least] += nbytes
    return _pruned(state, (), lambda path: owner.get(path, rank) == rank)


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _dict_tensors(node: dict, path: tuple):
    for key, value in node.items():
        if isinstance(value, torch.Tensor):
            yield path + (key,), value
        elif isinstance(value, dict):
            yield from _dict_tensors(value, path + (key,))


def _pruned(node: dict, path: tuple, keep) -> dict:
    out = {}
    for key, value in node.items():
        if isinstance(value, torch.Tensor):
            if keep(path + (key,)):
                out[key] = value
        elif isinstance(value, dict):
            out[key] = _pruned(value, path + (key,), keep)
        else:
            out[key] = value
    return out


def replicated(state: dict) -> bool:
    """No tensor of ``state`` is sharded over the ranks (a DTensor or a ShardedTensor): every rank holds all of it
    (DDP), so a restore of every rank reads every file of the checkpoint."""
    return not any(hasattr(t, "to_local") or hasattr(t, "local_shards") for t in _tensors(state))


def _tensors(node):
    if isinstance(node, torch.Tensor):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from _tensors(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from _tensors(value)


def _layout_of(node):
    """Keys, shapes and dtypes of a nest: staging reuses its buffers while this stays the same."""
    if isinstance(node, torch.Tensor):
        local = node.to_local() if hasattr(node, "to_local") else node
        return ("T", tuple(local.shape), str(local.dtype), type(node).__name__)
    if isinstance(node, dict):
        return tuple((k, _layout_of(v)) for k, v in node.items())
    if isinstance(node, (list, tuple)):
        return tuple(_layout_of(v) for v in node)
    return type(node).__name__


# ------------------------------------------------------------------ writing

# A replicated item smaller than this is written by the lowest rank holding it, larger ones spread over the
# ranks (DCP's default, which spreads them all): sharded states then keep their small replicated items
# (optimizer step counters) in rank 0's file, and a node restoring them fetches rank 0's file and its own
# ranks' files, not every node's (restore.py).
SMALL_REPLICATED_BYTES = 64 * 1024


def _save_planner():
    from torch.distributed.checkpoint import DefaultSavePlanner

    class SavePlanner(DefaultSavePlanner):
        def _dedup_save_plans(self, all_plans):
            holders: dict = {}
            for rank, plan in enumerate(all_plans):
                for item in plan.items:
                    if (item.tensor_storage_size() or 0) < SMALL_REPLICATED_BYTES:
                        holders.setdefault(item.index, rank)
            all_plans = [dataclasses.replace(plan, items=[item for item in plan.items
                                                          if holders.get(item.index, rank) == rank])
                         for rank, plan in enumerate(all_plans)]
            return super()._dedup_save_plans(all_plans)

    return SavePlanner()


# A rank's share of a large checkpoint is written as several files of about this size (at most MAX_FILES_PER_RANK,
# never more than its tensors): each is written by a thread of its own, and each is a unit the durable tier's
# readers fetch as soon as it is uploaded (a replacement's prefetch, a kept node's fill-in: agents/prefetch.py), so
# their download follows the upload a file behind instead of starting once a rank's whole share is up.
FILE_BYTES = 128 * 1024 * 1024
MAX_FILES_PER_RANK = 8


def files_for(items) -> int:
    """How many files a rank writes its share (``items``: its DCP write plan's) into: about one per FILE_BYTES, and
    no more than it has tensors large enough to fill a file's share (DCP puts the largest in files of their own, so
    a file opened for a small one would stay small)."""
    from torch.distributed.checkpoint.planner import WriteItemType

    sizes = sorted((item.tensor_storage_size() or 0 for item in items if item.type != WriteItemType.BYTE_IO),
                   reverse=True)
    files = max(1, min(MAX_FILES_PER_RANK, len(sizes), round(sum(sizes) / FILE_BYTES)))
    while files > 1 and sizes[files - 1] < sum(sizes) / files / 4:
        files -= 1
    return files


def _writer(folder: Path, on_closed=None):
    dcp, _ = _dcp()
    from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, _split_by_size_and_type

    class SplitWriter(dcp.FileSystemWriter):
        """DCP's file writer, with as many files (and threads) per rank as :func:`files_for` says: DCP spreads the
        items over them by size (``thread_count``), and an empty file is never made. With ``on_closed``, the files
        are written one after another, each handed to ``on_closed`` once closed and synced (early_upload.py)."""

        def write_data(self, plan, planner):
            self.thread_count = files_for(plan.items)
            if on_closed is None:
                return super().write_data(plan, planner)
            files: queue.Queue = queue.Queue()
            for index, bucket in enumerate(_split_by_size_and_type(self.thread_count, plan.items)):
                name = f"{plan.storage_data.prefix}{index}{DEFAULT_SUFFIX}"
                files.put((self.fs.concat_path(self.path, name), name, bucket))
            self.thread_count = 1
            return self._write_data(planner, files)

    writer = SplitWriter(str(folder), sync_files=True, overwrite=True)
    if on_closed is not None:
        writer.fs = _HandsOverClosedFiles(writer.fs, on_closed, DEFAULT_SUFFIX)
    return writer


class _HandsOverClosedFiles:
    """DCP's local file system, handing every data file (``suffix``) it has closed to ``on_closed``."""

    def __init__(self, fs, on_closed, suffix: str) -> None:
        self._fs, self._on_closed, self._suffix = fs, on_closed, suffix

    def __getattr__(self, name):
        return getattr(self._fs, name)

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        with self._fs.create_stream(path, mode) as stream:
            yield stream
        if str(path).endswith(self._suffix):  # not the .metadata, which is written last (as a temporary file)
            self._on_closed(Path(path))


def write(staged: dict, folder: Path, comm, on_closed=None) -> list[dict]:
    """Collective: write this rank's share of ``staged`` into ``folder``; return its files with checksums.
    ``on_closed``: called with each data file once it is complete on disk (the files are then written in turn)."""
    dcp, _ = _dcp()
    from torch.distributed.checkpoint.api import CheckpointException

    writer = _writer(folder, on_closed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "assuming the intent is to save in a single process"
            dcp.save(staged, storage_writer=writer, planner=_save_planner(), process_group=comm.group,
                     no_dist=comm.group is None)
    except CheckpointException as exc:  # a BaseException: it would end the persister's writer thread
        cause = _rank_failure(exc)
        if isinstance(cause, OSError):
            raise cause from exc
        raise OSError(f"{folder}: the checkpoint's files could not be written (a full or failing disk?): "
                      f"{_first_line(cause)}") from exc
    return own_files(folder, comm.rank)


def own_files(folder: Path, rank: int) -> list[dict]:
    """The files this rank wrote (DCP names them ``__<rank>_<n>.distcp``; rank 0 adds ``.metadata``)."""
    names = sorted(n for n in os.listdir(folder) if n.startswith(f"__{rank}_") and n.endswith(".distcp"))
    if rank == 0:
        names.append(METADATA_NAME)
    return [{"name": n, "bytes": (folder / n).stat().st_size, "checksum": file_digest(folder / n)} for n in names]


# ------------------------------------------------------------------ reading

_METADATA_MODULES = ("torch.distributed.checkpoint.metadata",)
_SAFE_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.filesystem", "_StoragePrefix"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"), ("collections", "OrderedDict"),
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes and refuses every other global (a forged .metadata cannot run code)."""

    def find_class(self, module: str, name: str):
        if module in _METADATA_MODULES or (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout,
                                                                          torch.memory_format)):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


def read_metadata(folder: Path):
    path = folder / METADATA_NAME
    try:
        with open(path, "rb") as f:
            return _MetadataUnpickler(f).load()
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{path} is missing") from exc
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a damaged or forged file
        raise CorruptCheckpointError(f"{path} cannot be read safely: {exc}") from exc


def _reader(folder: Path):
    dcp, _ = _dcp()
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.futures import Future

    class SafeReader(dcp.FileSystemReader):
        def read_data(self, plan, planner):
            if not READ_DIRECT:
                return super().read_data(plan, planner)
            by_dcp = super().read_data  # what dcp_read.py does not read itself
            dcp_read.read_data(self, plan, planner, lambda rest: by_dcp(rest, planner).wait())
            done = Future()
            done.set_result(None)
            return done

        def read_metadata(self, *args, **kwargs):
            metadata = read_metadata(Path(self.path))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(folder))


def _planner():
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._nested_dict import set_element

    class SafeLoadPlanner(DefaultLoadPlanner):
        """Byte items load with ``weights_only=True`` (DCP's own planner unpickles them unrestricted)."""

        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            fqn = read_item.dest_index.fqn
            data = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], data)
            else:
                self.state_dict[fqn] = data

    return SafeLoadPlanner()


def _target(folder: Path, metadata, objects: dict, rank: int, world_size: int, saved_world: int):
    """What this rank loads: (its state dict to fill, the key of the blob it reads)."""
    _, dsd = _dcp()
    keys = set(metadata.state_dict_metadata)
    blob_key = f"{BLOB_PREFIX}{rank if saved_world == world_size else 0}"
    if blob_key not in keys:
        raise CorruptCheckpointError(f"{folder}: no {blob_key} in the checkpoint's metadata")
    owners = optimizer_owners(objects)
    target: dict = {blob_key: b""}
    for name, obj in objects.items():
        saved_here = any(k.startswith(f"{name}.") for k in keys)
        if isinstance(obj, nn.Module):
            target[name] = dsd.get_model_state_dict(obj)
        elif name in owners and saved_here:
            target[name] = dsd.get_optimizer_state_dict(objects[owners[name]], obj)
    return target, blob_key


def files_needed(folder: Path, objects: dict, rank: int, world_size: int, saved_world: int) -> set[str]:
    """The files of the checkpoint in ``folder`` that this rank's load reads (only its ``.metadata`` need be
    there): the storage files DCP's read plan for this rank's state names, and the metadata itself."""
    metadata = read_metadata(folder)
    target, _ = _target(folder, metadata, objects, rank, world_size, saved_world)
    planner = _planner()
    planner.set_up_planner(target, metadata, rank == 0)
    storage = metadata.storage_data
    names = {METADATA_NAME}
    for item in planner.create_local_plan().items:
        info = storage.get(item.storage_index)
        if info is None:
            raise CorruptCheckpointError(f"{folder / METADATA_NAME}: no file holds {item.storage_index.fqn}")
        names.add(str(info.relative_path))
    return names


def load(folder: Path, objects: dict, extra: dict, comm, saved_world: int) -> None:
    """Collective: load the checkpoint in ``folder`` into the registered objects (resharding as needed)."""
    dcp, _ = _dcp()
    from torch.distributed.checkpoint.api import CheckpointException

    metadata = read_metadata(folder)
    same_world = saved_world == comm.world_size
    target, blob_key = _target(folder, metadata, objects, comm.rank, comm.world_size, saved_world)
    owners = optimizer_owners(objects)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(target, storage_reader=_reader(folder), planner=_planner(), process_group=comm.group,
                     no_dist=comm.group is None)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - DCP gathers every rank's failure in one
        cause = _rank_failure(exc)
        if isinstance(cause, CorruptCheckpointError):  # a file that changed since the restore verified it
            raise CorruptCheckpointError(str(cause)) from exc
        if isinstance(cause, (OSError, MemoryError)):  # the node's disk or memory, not the checkpoint's fit
            raise cause from exc
        raise RestoreError(f"{folder}: the checkpoint written by {saved_world} rank(s) cannot be loaded into "
                           f"{', '.join(target)} on {comm.world_size} rank(s): {_first_line(cause)}. Register the "
                           f"same model and optimizer as the run that saved it") from exc
    try:
        blob = torch.load(io.BytesIO(target[blob_key]), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a blob that is not plain data is refused
        raise CorruptCheckpointError(f"{folder}: {blob_key} holds something a safe load refuses ({exc})") from exc
    _apply(target, blob, objects, extra, owners, folder, restore_rng=same_world)


def _apply(target: dict, blob: dict, objects: dict, extra: dict, owners: dict, folder: Path,
           restore_rng: bool) -> None:
    _, dsd = _dcp()
    plain = blob.get("objects", {})
    for name, obj in objects.items():
        try:
            if isinstance(obj, nn.Module):
                dsd.set_model_state_dict(obj, target[name])
            elif name in target:
                dsd.set_optimizer_state_dict(objects[owners[name]], obj, target[name])
            elif name in plain:
                obj.load_state_dict(plain[name])
            else:
                raise RestoreError(f"{folder} has no state for {name}; register the same objects as the run that "
                                   f"saved it, or point local_dir/durable_url elsewhere to start fresh")
        except RestoreError:
            raise
        except Exception as exc:
            raise RestoreError(f"{folder}: {name}.load_state_dict failed ({exc}); the checkpoint was saved by a "
                               f"different {name}. Use the same setup, or another checkpoint folder") from exc
    extra.update(blob.get("extra", {}))
    if restore_rng:  # the same ranks: the steps after the resume can be the uninterrupted run's, bit for bit
        rng.restore(rng.from_portable(blob["rng"]))
        ddp_buckets.restore(objects, blob.get("ddp_buckets", {}))


def _rank_failure(exc: BaseException) -> BaseException:
    """The first rank's own error inside DCP's CheckpointException (which derives from BaseException, and whose
    text is every rank's traceback); any other error as it is."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = failures[min(failures)]
        return first[0] if isinstance(first, tuple) else first
    return exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
