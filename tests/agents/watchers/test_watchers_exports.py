"""The public API of agents.watchers, pinned."""

import agents.watchers


def test_exported_members():
    """agents.watchers exports exactly the names the agent and the CLI build on."""
    assert sorted(agents.watchers.__all__) == sorted([
        "AWSWatcher", "AzureWatcher", "ENDPOINT_VARIABLES", "GCPWatcher", "NoMetadataServer", "Notice",
        "WatchLoop", "Watcher", "WatcherError", "detect", "endpoint_for", "gcp_watchers", "probe", "watch",
        "watchers_for",
    ])
    assert all(hasattr(agents.watchers, name) for name in agents.watchers.__all__)
