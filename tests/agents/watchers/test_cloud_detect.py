"""Detection: endpoint variables first, otherwise probing the (link-local) candidates."""

import pytest

from agents.watchers import AWSWatcher, AzureWatcher, GCPWatcher, NoMetadataServer, detect, endpoint_for, probe
from agents.watchers.detect import LINK_LOCAL, watchers_for
from watcher_fixtures import imds, gce, azure  # noqa: F401 - pytest fixtures


def test_endpoint_variables_win_without_probing():
    """Set endpoint variables are used as they are; nothing is probed."""
    env = {"GCE_METADATA_HOST": "127.0.0.1:9", "AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.1:8"}
    assert detect(env, candidates={}) == {"aws": "http://127.0.0.1:8", "gcp": "127.0.0.1:9"}


def test_without_variables_the_link_local_address_is_used():
    """With no variable set, a named cloud's endpoint is the link-local metadata address."""
    assert endpoint_for("aws", {}) == "http://169.254.169.254"
    assert endpoint_for("gcp", {}) == "169.254.169.254"
    assert endpoint_for("azure", {"RUNNER_AZURE_METADATA_ENDPOINT": "http://127.0.0.1:7"}) == "http://127.0.0.1:7"


def test_unknown_cloud_lists_the_choices():
    """An unknown cloud name is refused with the three choices."""
    with pytest.raises(ValueError, match="aws, gcp, azure"):
        endpoint_for("oracle", {})


def test_each_probe_recognises_only_its_own_protocol(imds, gce, azure):
    """A probe says yes to its own cloud's server and no to the other two."""
    servers = {"aws": imds, "gcp": gce, "azure": azure}
    answers = {(cloud, name): probe(cloud, server.endpoint, timeout=0.5)
               for cloud in servers for name, server in servers.items()}
    assert [key for key, ok in answers.items() if ok] == [("aws", "aws"), ("gcp", "gcp"), ("azure", "azure")]


def test_probing_finds_the_cloud_that_answers(gce):
    """Without variables, detect() probes the candidates and keeps the one that answers."""
    candidates = {"aws": "http://127.0.0.1:9", "gcp": gce.endpoint, "azure": "http://127.0.0.1:9"}
    assert detect({}, timeout=0.3, candidates=candidates) == {"gcp": gce.endpoint}


def test_nothing_answering_says_what_to_do():
    """When no server answers, the error says to name a cloud or set an endpoint variable."""
    with pytest.raises(NoMetadataServer, match="--cloud and AWS_EC2_METADATA_SERVICE_ENDPOINT"):
        detect({}, timeout=0.2, candidates={cloud: "http://127.0.0.1:9" for cloud in LINK_LOCAL})


def test_watchers_for_builds_one_per_source_and_two_for_gcp():
    """AWS and Azure get one watcher each; GCP gets one per key."""
    kinds = [type(w) for w in watchers_for({"aws": "http://x", "gcp": "x", "azure": "http://x"})]
    assert kinds == [AWSWatcher, GCPWatcher, GCPWatcher, AzureWatcher]
