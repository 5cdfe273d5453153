"""AWS errors translated into the neutral provider errors, from botocore's real exception objects."""

from __future__ import annotations

import pytest
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from runner.providers.aws.errors import is_not_found, translate, translated
from runner.providers.errors import AuthError, NoCapacityError, PriceTooLowError, ProviderError, QuotaError


def client_error(code: str, message: str = "something happened", operation: str = "RunInstances") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, operation)


@pytest.mark.parametrize("code, neutral", [
    ("InsufficientInstanceCapacity", NoCapacityError),
    ("InsufficientCapacity", NoCapacityError),
    ("UnfulfillableCapacity", NoCapacityError),
    ("Unsupported", NoCapacityError),
    ("SpotMaxPriceTooLow", PriceTooLowError),
    ("MaxSpotInstanceCountExceeded", QuotaError),
    ("VcpuLimitExceeded", QuotaError),
    ("InstanceLimitExceeded", QuotaError),
])
def test_capacity_price_and_quota_codes_become_retryable_neutral_errors(code, neutral):
    """Each code maps to its neutral class, retryable with another offer, and the message keeps the code."""
    error = translate(client_error(code, "no room in us-east-1a"), "launch g4dn.xlarge in us-east-1a")
    assert type(error) is neutral and error.retryable
    assert code in str(error) and "no room in us-east-1a" in str(error) and "g4dn.xlarge" in str(error)


@pytest.mark.parametrize("code", ["AuthFailure", "InvalidClientTokenId", "SignatureDoesNotMatch", "ExpiredToken"])
def test_rejected_credentials_become_auth_errors_naming_the_credentials_chain(code):
    """Bad or expired credentials stop retries and say to check the credentials chain."""
    error = translate(client_error(code), "launch")
    assert type(error) is AuthError and error.retryable is False and "credentials chain" in str(error)


@pytest.mark.parametrize("code", ["UnauthorizedOperation", "AccessDenied"])
def test_missing_permissions_become_auth_errors_naming_the_policy(code):
    """A permission refusal stops retries and points at the IAM policy in docs/aws.md."""
    error = translate(client_error(code, "You are not authorized to perform this operation."), "launch")
    assert type(error) is AuthError and "docs/aws.md" in str(error) and "iam:PassRole" in str(error)


def test_missing_credentials_become_an_auth_error():
    """botocore's NoCredentialsError says no credentials were found and where to put them."""
    error = translate(NoCredentialsError(), "launch")
    assert type(error) is AuthError and "no usable credentials" in str(error) and "AWS_PROFILE" in str(error)


@pytest.mark.parametrize("code", ["RequestLimitExceeded", "Throttling", "ThrottlingException", "InternalError",
                                  "ServiceUnavailable"])
def test_throttling_and_server_errors_are_plain_retryable_provider_errors(code):
    """Throttling and server trouble are transient: a plain, retryable ProviderError."""
    error = translate(client_error(code), "describe")
    assert type(error) is ProviderError and error.retryable and "will retry" in str(error)


@pytest.mark.parametrize("exc", [EndpointConnectionError(endpoint_url="https://ec2.us-east-1.amazonaws.com"),
                                 ReadTimeoutError(endpoint_url="https://ec2.us-east-1.amazonaws.com")])
def test_network_failures_are_plain_retryable_provider_errors(exc):
    """Connection failures and timeouts are a plain, retryable ProviderError."""
    error = translate(exc, "describe")
    assert type(error) is ProviderError and error.retryable


def test_an_unlisted_code_is_a_provider_error_with_the_code_and_message():
    """Any other code becomes a ProviderError naming the action, the code and AWS's message."""
    error = translate(client_error("DryRunOperation", "Request would have succeeded"), "launch g5.xlarge")
    assert type(error) is ProviderError
    assert str(error) == "AWS launch g5.xlarge: DryRunOperation: Request would have succeeded"


def test_a_config_mistake_names_the_key_to_fix():
    """An unknown AMI points at clouds.aws.image_id."""
    error = translate(client_error("InvalidAMIID.NotFound", "The image id '[ami-1]' does not exist"), "launch")
    assert "clouds.aws.image_id" in str(error)


def test_translated_reraises_as_the_neutral_error_with_the_cause_kept():
    """The context manager turns a botocore exception into the neutral one, chained to the original."""
    original = client_error("InsufficientInstanceCapacity")
    with pytest.raises(NoCapacityError) as raised:
        with translated("launch"):
            raise original
    assert raised.value.__cause__ is original


def test_translated_lets_other_exceptions_through():
    """Exceptions that are not botocore's are not translated."""
    with pytest.raises(KeyError):
        with translated("launch"):
            raise KeyError("x")


def test_not_found_is_recognised_only_for_unknown_instance_ids():
    """is_not_found is true for InvalidInstanceID.NotFound and nothing else."""
    assert is_not_found(client_error("InvalidInstanceID.NotFound", operation="DescribeInstances"))
    assert not is_not_found(client_error("InvalidAMIID.NotFound"))
    assert not is_not_found(NoCredentialsError())
