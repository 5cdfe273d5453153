"""Compute Engine errors, from zone operations and from API calls, become the runner's neutral errors."""

from __future__ import annotations

import pytest
import requests
from google.api_core import exceptions
from google.auth.exceptions import DefaultCredentialsError, TransportError

from runner.home import ConfigError
from runner.providers.errors import AuthError, NoCapacityError, ProviderError, QuotaError
from runner.providers.gcp.errors import GCPConfigError, api_error, operation_error

WHERE = "launching n1-standard-8 (spot) in us-central1-a"


def failed(code: str, message: str = "details", status: int = 503, **extra) -> dict:
    return {"status": "DONE", "httpErrorStatusCode": status,
            "error": {"errors": [{"code": code, "message": message, **extra}]}}


def http_error(status: int, message: str, reason: str | None = None) -> exceptions.GoogleAPICallError:
    errors = [{"message": message, "domain": "global", "reason": reason}] if reason else []
    return exceptions.from_http_status(status, message, errors=errors)


def test_a_successful_operation_is_no_error():
    """A DONE operation without an error block translates to None."""
    assert operation_error({"status": "DONE"}, where=WHERE) is None


@pytest.mark.parametrize("code", ["ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                                  "UNSUPPORTED_OPERATION"])
def test_stockouts_are_no_capacity(code):
    """Resource-pool exhaustion and unsupported (stocked-out) Spot requests become NoCapacityError."""
    error = operation_error(failed(code), where=WHERE)
    assert isinstance(error, NoCapacityError) and error.retryable
    assert code in str(error) and "us-central1-a" in str(error)


def test_quota_in_an_operation_names_the_quota():
    """QUOTA_EXCEEDED becomes QuotaError whose message names the quota and how to raise it."""
    error = operation_error(failed("QUOTA_EXCEEDED", "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.",
                                   403), where=WHERE)
    assert isinstance(error, QuotaError)
    assert "GPUS_ALL_REGIONS" in str(error) and "ask for it" in str(error)


def test_quota_named_only_in_the_details_is_still_named():
    """When the message lacks the quota's name, it is read from errorDetails.quotaInfo."""
    detail = [{"quotaInfo": {"metricName": "compute.googleapis.com/nvidia_t4_gpus"}}]
    error = operation_error(failed("QUOTA_EXCEEDED", "over quota", 403, errorDetails=detail), where=WHERE)
    assert isinstance(error, QuotaError) and "NVIDIA_T4_GPUS" in str(error)


def test_another_operation_error_is_a_provider_error_with_its_code():
    """Any other operation error becomes a plain ProviderError carrying the code and message."""
    error = operation_error(failed("RESOURCE_NOT_READY", "disk not ready", 400), where=WHERE)
    assert type(error) is ProviderError and "RESOURCE_NOT_READY: disk not ready" in str(error)


@pytest.mark.parametrize("status", [401, 403])
def test_refused_calls_are_auth_errors_naming_the_roles(status):
    """401 and 403 become a non-retryable AuthError naming the roles to grant and docs/gcp.md."""
    error = api_error(http_error(status, "Required 'compute.instances.create' permission", "forbidden"),
                      where=WHERE)
    assert isinstance(error, AuthError) and not error.retryable
    assert "roles/compute.instanceAdmin.v1" in str(error) and "roles/iam.serviceAccountUser" in str(error)
    assert "docs/gcp.md" in str(error)


def test_a_quota_refused_by_the_call_is_a_quota_error():
    """A 403 with reason quotaExceeded is a QuotaError, not an AuthError."""
    error = api_error(http_error(403, "Quota 'CPUS' exceeded.  Limit: 24.0 in region us-central1.",
                                 "quotaExceeded"), where=WHERE)
    assert isinstance(error, QuotaError) and "CPUS" in str(error)


def test_rate_limiting_is_retryable_not_auth():
    """A 403 rateLimitExceeded is a retryable ProviderError, never an AuthError."""
    error = api_error(http_error(403, "Rate Limit Exceeded", "rateLimitExceeded"), where=WHERE)
    assert type(error) is ProviderError and error.retryable


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_server_errors_are_retryable_provider_errors(status):
    """5xx and 429 become a retryable ProviderError."""
    error = api_error(http_error(status, "backend error"), where=WHERE)
    assert type(error) is ProviderError and error.retryable


def test_retries_that_ran_out_report_the_last_error():
    """A RetryError is translated through its cause."""
    cause = http_error(403, "Required 'compute.instances.get' permission", "forbidden")
    assert isinstance(api_error(exceptions.RetryError("gave up", cause), where=WHERE), AuthError)


def test_an_unreachable_api_is_a_retryable_provider_error():
    """A connection error never reached the API: a retryable ProviderError that says so."""
    error = api_error(requests.ConnectionError("connection refused"), where=WHERE)
    assert type(error) is ProviderError and "cannot reach the Compute API" in str(error)


def test_missing_credentials_are_an_auth_error_telling_the_fix():
    """No application-default credentials: AuthError telling how to provide them."""
    error = api_error(DefaultCredentialsError("Could not automatically determine credentials"), where=WHERE)
    assert isinstance(error, AuthError) and "gcloud auth application-default login" in str(error)


def test_a_token_refresh_that_failed_on_the_network_is_retryable():
    """A google-auth TransportError (network) is a retryable ProviderError, not an AuthError."""
    error = api_error(TransportError("timed out"), where=WHERE)
    assert type(error) is ProviderError


def test_config_errors_are_the_runners_config_errors():
    """GCPConfigError is a ConfigError (the CLI's one-line message) and a ValueError."""
    assert issubclass(GCPConfigError, ConfigError) and issubclass(GCPConfigError, ValueError)
