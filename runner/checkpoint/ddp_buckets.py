"""Resume a DistributedDataParallel model with the gradient buckets it had when it was saved.

DDP reduces its first backward in one bucket holding every parameter in definition order, then rebuilds its
buckets in the order the gradients became ready, and reduces every later backward in those. A ring
all-reduce over more than two ranks (gloo's, NCCL's) adds up each element in an order that depends on its
offset in the bucket, so the two layouts give sums that differ in the last bits. An uninterrupted run reduces
with the first layout once; a resumed run, whose DDP is new, would do so once more at the resume, and end
with slightly different weights.

So a checkpoint records each DDP's bucket layout (parameter names, bucket by bucket), and a restore at the
same number of ranks builds the new DDP's reducer with that layout, the way DDP itself rebuilds it after
unpickling (``_ddp_init_helper``). The first backward after the resume then sums exactly as the uninterrupted
run's did at that step: the resume is bit-exact with default DDP settings. A layout taken before the first
backward is the first one, which is what a new DDP has anyway.

This reaches into DDP's private methods; anything unexpected (another torch, a communication hook, mixed
precision, optimizer-in-backward) leaves the DDP as it is, with a warning: the resume is then exact only
in the state restored, not in the last bits of the following steps.
"""

from __future__ import annotations

from .log import get_logger

log = get_logger()
_CACHE_ATTR = "_runner_bucket_layout"


def _is_ddp(obj) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(obj, DistributedDataParallel)


def _never_rebuilds(ddp) -> bool:
    """DDP keeps its first layout for good when it looks for unused parameters without a static graph."""
    return bool(getattr(ddp, "find_unused_parameters", False)) and not getattr(ddp, "static_graph", False)


def _names(ddp) -> dict[int, str]:
    return {id(p): name for name, p in ddp.module.named_parameters()}


def layout(ddp) -> list[list[str]] | None:
    """The names of the parameters of each of ``ddp``'s gradient buckets, in the order they are reduced."""
    if _never_rebuilds(ddp):
        return None
    cached = getattr(ddp, _CACHE_ATTR, None)
    if cached is not None:
        return cached
    try:
        if ddp.reducer._rebuild_buckets():  # a backward ran since the last forward: what the next forward does
            ddp._has_rebuilt_buckets = True
        names = _names(ddp)
        buckets = [[names[id(p)] for p in bucket.parameters()] for bucket in ddp.reducer._get_zeros_like_grad_buckets()]
    except Exception as exc:  # noqa: BLE001 - another torch: the checkpoint is still good without it
        log.warning("could not read DistributedDataParallel's gradient buckets; a resume will be exact in its "
                    "state but may differ in the last bits of later steps", error=f"{type(exc).__name__}: {exc}")
        return None
    if buckets != [[name for name in names.values() if name in _flat(buckets)]]:
        setattr(ddp, _CACHE_ATTR, buckets)  # rebuilt: it never changes again (reading it allocates a copy)
    return buckets


def _flat(buckets: list[list[str]]) -> set[str]:
    return {name for bucket in buckets for name in bucket}


def adopt(ddp, buckets: list[list[str]]) -> bool:
    """Build ``ddp``'s reducer with the recorded ``buckets``; False (and nothing changed) where it cannot."""
    import torch.distributed as dist

    refuse = None
    if getattr(ddp, "_comm_hooks", None):
        refuse = "a communication hook is registered"
    elif getattr(ddp, "mixed_precision", None) is not None or getattr(ddp, "_use_python_reducer", False):
        refuse = "mixed precision or the Python reducer is in use"
    elif getattr(ddp, "_has_rebuilt_buckets", False):
        refuse = "it has already trained"
    if refuse is None:
        try:
            parameters, expect_sparse = ddp._build_params_for_reducer()
            names = _names(ddp)
            index = {names.get(id(p)): i for i, p in enumerate(parameters)}
            indices = [[index[name] for name in bucket] for bucket in buckets]
        except (AttributeError, KeyError, TypeError):
            refuse = "its parameters are not those of the checkpoint"
        else:
            if sorted(i for bucket in indices for i in bucket) != list(range(len(parameters))):
                refuse = "its parameters are not those of the checkpoint"
    if refuse is not None:
        log.warning("DistributedDataParallel keeps its own gradient buckets after the restore: " + refuse +
                    "; the steps after the resume may differ in the last bits from an uninterrupted run")
        return False
    cap = int(getattr(ddp, "bucket_bytes_cap", 25 * 1024 * 1024))
    recorded = (list(reversed(indices)), [cap] * len(indices))  # _ddp_init_helper reverses them back
    original = dist._compute_bucket_assignment_by_size
    dist._compute_bucket_assignment_by_size = lambda *args, **kwargs: recorded
    try:
        ddp._ddp_init_helper(parameters, expect_sparse, ddp._build_debug_param_to_name_mapping(parameters),
                             ddp.static_graph)
        if ddp.static_graph:
            ddp.reducer._set_static_graph()
            ddp.logger._set_static_graph()
    except Exception as exc:  # noqa: BLE001 - another torch
        log.warning("could not give DistributedDataParallel its saved gradient buckets; the steps after the "
                    "resume may differ in the last bits", error=f"{type(exc).__name__}: {exc}")
        return False
    finally:
        dist._compute_bucket_assignment_by_size = original
    return True


def record(objects: dict) -> dict:
    """Each registered DDP's bucket layout, by the name it is registered under."""
    out = {}
    for name, obj in objects.items():
        if _is_ddp(obj):
            buckets = layout(obj)
            if buckets is not None:
                out[name] = buckets
    return out


def restore(objects: dict, recorded: dict) -> None:
    for name, buckets in recorded.items():
        obj = objects.get(name)
        if obj is not None and _is_ddp(obj):
            adopt(obj, buckets)
