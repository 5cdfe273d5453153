"""Compute Engine errors translated, once, into the runner's neutral provider errors.

GCE reports most launch failures in the zone operation (already DONE, with an ``error`` block), not in
the insert call: stockouts (``ZONE_RESOURCE_POOL_EXHAUSTED``) and quotas (``QUOTA_EXCEEDED``) arrive
that way. Other failures are HTTP errors of the call itself (``google.api_core`` exceptions, read here
by their ``code``, ``errors`` and ``reason`` attributes so this module needs no SDK).

Operations are read as REST JSON dicts (camelCase), the shape the API and the test fake speak.
"""

from __future__ import annotations

import re

from ...home import ConfigError
from ..errors import AuthError, NoCapacityError, ProviderError, QuotaError

# Roles a controller's credentials need; docs/gcp.md explains them and lists a custom role's permissions.
ROLES_HINT = ("grant the controller's account roles/compute.instanceAdmin.v1 on the project and "
              "roles/iam.serviceAccountUser on the VMs' service account (see docs/gcp.md)")

CAPACITY_CODES = frozenset({
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "UNSUPPORTED_OPERATION",  # e.g. the machine type is not offered as Spot in the zone right now
    "RESOURCE_POOL_EXHAUSTED",
    "STOCKOUT",
})
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED"})
QUOTA_REASONS = frozenset({"quotaExceeded", "QUOTA_EXCEEDED"})
RATE_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"})
PERMISSION_CODES = frozenset({"PERMISSION_DENIED", "FORBIDDEN"})
QUOTA_NAME = re.compile(r"Quota '([A-Za-z0-9_\-]+)' exceeded")


class GCPConfigError(ConfigError, ValueError):
    """``clouds.gcp`` in config.yaml cannot be used; the message names the key and the fix."""


def operation_error(operation: dict, *, where: str) -> ProviderError | None:
    """The neutral error a finished zone operation carries, or None when it succeeded.

    ``where`` says what was attempted (``"insert n1-standard-4 in us-central1-a"``) for the message.
    """
    errors = (operation.get("error") or {}).get("errors") or []
    if not errors:
        return None
    codes = [str(e.get("code", "")) for e in errors]
    message = "; ".join(f"{e.get('code', '?')}: {e.get('message', '').strip()}" for e in errors)
    if any(code in CAPACITY_CODES or "STOCKOUT" in code for code in codes):
        return NoCapacityError(f"GCP has no capacity for {where} right now ({message}); another zone or type may")
    if any(code in QUOTA_CODES for code in codes):
        return QuotaError(_quota_message(where, _quota_name(errors), message))
    status = operation.get("httpErrorStatusCode")
    if status in (401, 403) and any(code in PERMISSION_CODES for code in codes):
        return AuthError(f"GCP refused {where}: {message}; {ROLES_HINT}")
    return ProviderError(f"GCP failed {where}: {message}")


def api_error(exc: Exception, *, where: str) -> ProviderError:
    """The neutral error for an exception raised by a Compute API call."""
    if isinstance(exc, ProviderError):
        return exc
    kind = type(exc).__name__
    if kind == "RetryError" and getattr(exc, "cause", None) is not None:  # retries ran out: report the last error
        return api_error(exc.cause, where=where)
    if type(exc).__module__.startswith("google.auth"):
        if kind == "TransportError":
            return ProviderError(f"Google credentials could not be refreshed for {where} ({exc}); will retry")
        return AuthError(f"no usable Google credentials for {where} ({exc}); run "
                         "`gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS, "
                         f"and {ROLES_HINT}")
    status = getattr(exc, "code", None)
    if not isinstance(status, int):
        # requests' connection errors and timeouts, or anything else that never got an HTTP answer.
        return ProviderError(f"cannot reach the Compute API for {where}: {kind}: {exc}")
    message = getattr(exc, "message", None) or str(exc)
    reasons = _reasons(exc)
    if reasons & QUOTA_REASONS or QUOTA_NAME.search(message):
        return QuotaError(_quota_message(where, _quota_name([{"message": message}]), message))
    if reasons & RATE_REASONS or status == 429:
        return ProviderError(f"the Compute API is rate limiting {where} ({message}); will retry")
    if status in (401, 403):
        return AuthError(f"GCP refused {where} (HTTP {status}: {message}); {ROLES_HINT}")
    if status == 404:
        return ProviderError(f"GCP could not find what {where} needs (HTTP 404: {message}); "
                             "check clouds.gcp.project, image, network and subnetwork")
    if status == 400:
        return ProviderError(f"GCP rejected {where} as invalid (HTTP 400: {message})")
    return ProviderError(f"the Compute API failed {where} (HTTP {status}: {message}); will retry")


def _reasons(exc: Exception) -> set[str]:
    found = set()
    reason = getattr(exc, "reason", None)
    if reason:
        found.add(str(reason))
    for error in getattr(exc, "errors", None) or []:
        if isinstance(error, dict) and error.get("reason"):
            found.add(str(error["reason"]))
    return found


def _quota_name(errors: list[dict]) -> str | None:
    for error in errors:
        found = QUOTA_NAME.search(str(error.get("message", "")))
        if found:
            return found.group(1)
        for detail in error.get("errorDetails") or []:
            info = detail.get("quotaInfo") or {}
            if info.get("metricName"):
                return info["metricName"].rsplit("/", 1)[-1].upper()
    return None


def _quota_message(where: str, quota: str | None, message: str) -> str:
    named = f"the GCP quota {quota}" if quota else "a GCP quota"
    advice = ("GPUS_ALL_REGIONS caps GPUs in the whole project and starts at 0: ask for it first"
              if quota == "GPUS_ALL_REGIONS" else "request more under IAM & Admin > Quotas, or use another region")
    return f"{named} stops {where} ({message}); {advice}"
