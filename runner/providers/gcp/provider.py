"""The GCP provider: Spot and on-demand Compute Engine VMs through ``google-cloud-compute`` (REST).

- ``launch`` inserts the VM with a ``requestId`` derived from the node id and a name derived from it
  too, waits on the zone operation and translates its error; a retried launch finds the same VM.
- ``describe`` reads the VM. A VM that is gone or stopped counts as preempted when the zone holds a
  ``compute.instances.preempted`` operation for it, or when it is a Spot VM that stopped (the runner
  never stops its VMs, it deletes them; GCE stops a Spot VM only to reclaim it). An API error is never
  "gone": it raises ProviderError and the next tick asks again.
- ``terminate`` deletes the VM; a VM already gone is fine; without a ref it is found by its label.

``RUNNER_GCP_COMPUTE_ENDPOINT`` redirects every call (an ``http://`` URL means anonymous credentials).
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import time

import structlog

from ..base import CheckpointBucket, CloudGangs, LaunchRequest, NodeStatus, Provider
from ..bootstrap import render_bootstrap
from ..errors import ProviderError
from ..offers import Offer
from . import requests as build
from .errors import GCPConfigError, api_error, operation_error

log = structlog.get_logger(__name__)

ENDPOINT_VARIABLE = "RUNNER_GCP_COMPUTE_ENDPOINT"
ALIVE = frozenset({"PROVISIONING", "STAGING", "RUNNING", "REPAIRING"})
STOPPED = frozenset({"STOPPING", "PENDING_STOP", "STOPPED", "TERMINATED", "SUSPENDING", "SUSPENDED"})


class GCPProvider(Provider, CloudGangs, CheckpointBucket):
    """Compute Engine nodes in the zones of ``clouds.gcp``; credentials from the usual Google chain."""

    name = "gcp"

    def __init__(self, config: dict, *, credentials=None, endpoint: str | None = None,
                 catalog: list[Offer] | None = None, call_timeout: float = 30.0, retry_seconds: float = 20.0,
                 operation_timeout: float = 600.0):
        self.config = build.parse_config(config)
        self.checkpoint_url = self.config.checkpoint_url
        if importlib.util.find_spec("google.cloud.compute_v1") is None:
            raise GCPConfigError("clouds.gcp: needs google-cloud-compute; install it with pip install 'spot-runner[gcp]'")
        self.endpoint = endpoint if endpoint is not None else os.environ.get(ENDPOINT_VARIABLE) or None
        if self.endpoint and not self.endpoint.startswith(("http://", "https://")):
            raise GCPConfigError(f"{ENDPOINT_VARIABLE}: {self.endpoint!r} must be an http:// or https:// URL")
        self._credentials = credentials
        self._catalog = catalog
        self.call_timeout = call_timeout
        self.retry_seconds = retry_seconds
        self.operation_timeout = operation_timeout
        self._clients = None
        self._lock = threading.Lock()

    # -- offers ------------------------------------------------------------------------------------
    def offers(self) -> list[Offer]:
        if self._catalog is None:
            from ..catalog import load_catalog

            self._catalog = load_catalog()
        zones = set(self.config.zones)
        return [o for o in self._catalog if o.cloud == "gcp" and o.zone in zones]

    # -- launch ------------------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> str:
        offer = request.offer
        zone, name = offer.zone, build.instance_name(request.node_id)
        what = f"launching {offer.instance_type} ({'spot' if request.spot else 'on-demand'}) in {zone}"
        if offer.cloud != "gcp" or zone not in self.config.zones:
            raise ProviderError(f"{what}: the offer is not in clouds.gcp.zones ({', '.join(self.config.zones)})")
        script = render_bootstrap(request.bootstrap, cloud="gcp", zone=zone, package=self.config.agent_package)
        body = build.instance_body(self.config, request, script)
        if body.get("resourcePolicies"):
            self._ensure_placement_policy(request.job_id, build.region_of(zone), what)
        from google.cloud import compute_v1

        instances, _ = self._client()
        insert = compute_v1.InsertInstanceRequest(
            project=self.config.project, zone=zone, request_id=build.request_id(request.node_id),
            instance_resource=compute_v1.Instance.from_json(json.dumps(body)))
        operation = self._call(what, instances.insert_unary, request=insert, conflict_ok=True)
        if operation is CONFLICT:  # the VM exists: a launch retried after its request id expired
            return self._adopt(request.node_id, zone, name, what)
        done = self._wait(zone, _as_dict(operation), what)
        failure = operation_error(done, where=what)
        if failure is not None:
            raise failure
        log.info("gcp node launched", node=request.node_id, zone=zone, vm=name, spot=request.spot)
        return build.make_ref(zone, name)

    def _ensure_placement_policy(self, job_id: str, region: str, what: str) -> None:
        """Create the job's compact placement policy unless it exists (one per job, kept across attempts)."""
        from google.cloud import compute_v1

        policies = self._policies_client()
        body = build.placement_policy_body(job_id)
        insert = compute_v1.InsertResourcePolicyRequest(
            project=self.config.project, region=region, request_id=build.request_id(f"policy-{job_id}"),
            resource_policy_resource=compute_v1.ResourcePolicy.from_json(json.dumps(body)))
        operation = self._call(f"{what}: creating placement policy {body['name']}", policies.insert_unary,
                               request=insert, conflict_ok=True)
        if operation is not CONFLICT:
            failure = operation_error(_as_dict(operation), where=f"{what}: placement policy {body['name']}")
            if failure is not None:
                raise failure
            log.info("gcp placement policy created", job=job_id, policy=body["name"], region=region)

    def _policies_client(self):
        with self._lock:
            if getattr(self, "_policies", None) is None:
                from google.cloud import compute_v1

                credentials, options = self._credentials_and_options()
                try:
                    self._policies = compute_v1.ResourcePoliciesClient(
                        credentials=credentials, client_options=options, transport="rest")
                except _api_errors() as exc:
                    raise api_error(exc, where="connecting to the Compute API") from exc
            return self._policies

    def _adopt(self, node_id: str, zone: str, name: str, what: str) -> str:
        instance = self._get(zone, name, what)
        if instance is None:
            raise ProviderError(f"{what}: GCP said VM {name} exists, then could not find it; will retry")
        if (instance.get("labels") or {}).get(build.LABEL_NODE) != build.label_value(node_id):
            raise ProviderError(f"{what}: a VM named {name} already exists in {zone} and is not node {node_id}'s; "
                                "delete it or rename it")
        return build.make_ref(zone, name)

    def _wait(self, zone: str, operation: dict, what: str) -> dict:
        """Wait for a zone operation to be DONE (``operations.wait`` returns within about 2 minutes)."""
        _, operations = self._client()
        deadline = time.monotonic() + self.operation_timeout
        while operation.get("status") != "DONE":
            if time.monotonic() > deadline:
                raise ProviderError(f"{what}: operation {operation.get('name')} is still "
                                    f"{operation.get('status')} after {self.operation_timeout:.0f}s")
            operation = _as_dict(self._call(f"{what} (waiting on {operation.get('name')})", operations.wait,
                                            project=self.config.project, zone=zone, operation=operation["name"],
                                            timeout=max(self.call_timeout, 150.0)))
        return operation

    # -- describe ----------------------------------------------------------------------------------
    def describe(self, node_id: str, provider_ref: str | None) -> NodeStatus:
        if provider_ref:
            zone, name = build.parse_ref(provider_ref)
        else:
            found = self._find(node_id)
            if not found:
                return NodeStatus(alive=False, reason="not-found")
            zone, name = found[0]
        what = f"describing node {node_id} ({zone}/{name})"
        instance = self._get(zone, name, what)
        status = (instance or {}).get("status", "")
        if instance is not None and status not in STOPPED:
            if status not in ALIVE:
                log.warning("gcp vm in an unknown state; counted as alive", node=node_id, status=status)
            return NodeStatus(alive=True)
        if self._was_preempted(zone, name, what):
            return NodeStatus(alive=False, reason="preempted")
        if instance is None:
            return NodeStatus(alive=False, reason="not-found")
        spot = (instance.get("scheduling") or {}).get("provisioningModel") == "SPOT" or \
            bool((instance.get("scheduling") or {}).get("preemptible"))
        if spot and status in ("STOPPING", "PENDING_STOP", "TERMINATED"):
            return NodeStatus(alive=False, reason="preempted")
        return NodeStatus(alive=False, reason="terminated")

    def _get(self, zone: str, name: str, what: str) -> dict | None:
        """The VM as REST JSON, or None when GCE answers 404; any other failure raises ProviderError."""
        instances, _ = self._client()
        found = self._call(what, instances.get, project=self.config.project, zone=zone, instance=name,
                           missing_ok=True)
        return None if found is None else _as_dict(found)

    def _was_preempted(self, zone: str, name: str, what: str) -> bool:
        _, operations = self._client()
        suffix = f"/zones/{zone}/instances/{name}"
        from google.cloud import compute_v1

        listing = compute_v1.ListZoneOperationsRequest(project=self.config.project, zone=zone,
                                                       filter=build.preempted_filter(), max_results=500)
        pager = self._call(f"{what} (reading the zone's preemptions)", operations.list, request=listing)
        return any(op.target_link.endswith(suffix) for op in self._pages(pager, what))

    # -- terminate ---------------------------------------------------------------------------------
    def terminate(self, node_id: str, provider_ref: str | None) -> None:
        targets = [build.parse_ref(provider_ref)] if provider_ref else self._find(node_id)
        instances, _ = self._client()
        for zone, name in targets:
            what = f"deleting node {node_id} ({zone}/{name})"
            operation = self._call(what, instances.delete_unary, project=self.config.project, zone=zone,
                                   instance=name, missing_ok=True)
            if operation is None:
                continue
            # The delete runs on; only an error already reported (the operation is DONE) is raised.
            failure = operation_error(_as_dict(operation), where=what)
            if failure is not None:
                raise failure
            log.info("gcp node deleted", node=node_id, zone=zone, vm=name)

    def _find(self, node_id: str) -> list[tuple[str, str]]:
        """The node's VMs, by label, in every configured zone (for a node whose ref was never recorded)."""
        from google.cloud import compute_v1

        instances, _ = self._client()
        found = []
        for zone in self.config.zones:
            where = f"looking for node {node_id} in {zone}"
            listing = compute_v1.ListInstancesRequest(project=self.config.project, zone=zone,
                                                      filter=build.node_filter(node_id))
            pager = self._call(where, instances.list, request=listing)
            found.extend((zone, vm.name) for vm in self._pages(pager, where))
        return found

    # -- calls -------------------------------------------------------------------------------------
    def _call(self, what: str, method, *, missing_ok: bool = False, conflict_ok: bool = False, **kwargs):
        """One API call with brief retries; its failure becomes a neutral error (404: None if ``missing_ok``)."""
        kwargs.setdefault("timeout", self.call_timeout)
        try:
            return method(retry=self._retry(), **kwargs)
        except _api_errors() as exc:
            code = getattr(exc, "code", None)
            if missing_ok and code == 404:
                return None
            if conflict_ok and code == 409:
                return CONFLICT
            raise api_error(exc, where=what) from exc

    def _pages(self, pager, what: str):
        """Iterate a list pager; fetching a later page can fail like any call."""
        try:
            yield from pager
        except _api_errors() as exc:
            raise api_error(exc, where=what) from exc

    # -- clients -----------------------------------------------------------------------------------
    def _client(self):
        """(InstancesClient, ZoneOperationsClient), built on first use with the same endpoint and credentials."""
        with self._lock:
            if self._clients is None:
                self._clients = self._build_clients()
            return self._clients

    def _credentials_and_options(self):
        """The credentials and client options every client uses (anonymous against an ``http://`` endpoint)."""
        from google.api_core.client_options import ClientOptions

        credentials = self._credentials
        options = None
        if self.endpoint:
            options = ClientOptions(api_endpoint=self.endpoint)
            if credentials is None and self.endpoint.startswith("http://"):
                from google.auth.credentials import AnonymousCredentials

                credentials = AnonymousCredentials()
        return credentials, options

    def _build_clients(self):
        from google.cloud import compute_v1

        credentials, options = self._credentials_and_options()
        try:
            return (compute_v1.InstancesClient(credentials=credentials, client_options=options, transport="rest"),
                    compute_v1.ZoneOperationsClient(credentials=credentials, client_options=options,
                                                    transport="rest"))
        except _api_errors() as exc:  # no application-default credentials, usually
            raise api_error(exc, where="connecting to the Compute API") from exc

    def _retry(self):
        """Transient failures (5xx, 429, connection resets) are retried briefly; the reconciler retries later."""
        import requests as http
        from google.api_core import exceptions, retry

        return retry.Retry(
            predicate=retry.if_exception_type(
                exceptions.InternalServerError, exceptions.BadGateway, exceptions.ServiceUnavailable,
                exceptions.GatewayTimeout, exceptions.TooManyRequests, http.ConnectionError, http.Timeout),
            initial=0.2, maximum=2.0, multiplier=2.0, timeout=self.retry_seconds)


CONFLICT = object()  # what _call returns for a 409 when asked to


def _api_errors() -> tuple[type[BaseException], ...]:
    """What an SDK call raises when the API or the network fails (not programming errors)."""
    import requests as http
    from google.api_core import exceptions
    from google.auth import exceptions as auth

    return (exceptions.GoogleAPIError, auth.GoogleAuthError, http.RequestException)


def _as_dict(message) -> dict:
    """A compute_v1 message as REST JSON (what errors.py and the fake speak)."""
    return json.loads(type(message).to_json(message, use_integers_for_enums=False, indent=None))
