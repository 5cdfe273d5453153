"""Preemption watchers: one per cloud metadata protocol, run by one loop.

    from agents.watchers import WatchLoop, detect, watchers_for
    loop = WatchLoop(watchers_for(detect()), on_notice, state_path=state_dir / "notice.json").start()
"""

from .aws import AWSWatcher
from .azure import AzureWatcher
from .base import Notice, Watcher, WatcherError
from .detect import ENDPOINT_VARIABLES, NoMetadataServer, detect, endpoint_for, probe, watchers_for
from .gcp import GCPWatcher, gcp_watchers
from .loop import WatchLoop
from .watch import watch

__all__ = [
    "AWSWatcher", "AzureWatcher", "ENDPOINT_VARIABLES", "GCPWatcher", "NoMetadataServer", "Notice", "WatchLoop",
    "Watcher", "WatcherError", "detect", "endpoint_for", "gcp_watchers", "probe", "watch", "watchers_for",
]
