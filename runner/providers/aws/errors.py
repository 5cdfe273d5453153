"""AWS errors translated, once, into the neutral provider errors of ``runner.providers.errors``.

Every call the AWS provider makes goes through :func:`translated`; nothing above this module sees a
botocore exception. The tables below are the whole mapping: an error code not listed becomes a plain
:class:`ProviderError` that names the code and AWS's message.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)

from ...home import ConfigError
from ..errors import AuthError, NoCapacityError, PriceTooLowError, ProviderError, QuotaError

POLICY_DOC = "docs/aws.md"
CREDENTIALS_FIX = ("check the AWS credentials chain (AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                   "~/.aws/credentials, or the controller's instance role)")
POLICY_FIX = f"grant the controller the IAM policy in {POLICY_DOC} (it includes iam:PassRole for the instance profile)"

# The zone has no room for this type now, or never offers it: another offer may succeed.
NO_CAPACITY = frozenset({
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "InsufficientHostCapacity",
    "UnfulfillableCapacity",
    "InsufficientFreeAddressesInSubnet",
    "Unsupported",  # "the requested instance type is not supported in the requested Availability Zone"
})
PRICE_TOO_LOW = frozenset({"SpotMaxPriceTooLow"})
QUOTA = frozenset({
    "MaxSpotInstanceCountExceeded",
    "VcpuLimitExceeded",
    "InstanceLimitExceeded",
})
BAD_CREDENTIALS = frozenset({
    "AuthFailure",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "RequestExpired",
    "UnrecognizedClientException",
})
NOT_PERMITTED = frozenset({"UnauthorizedOperation", "AccessDenied", "AccessDeniedException"})
# Transient: the same call may succeed a moment later.
THROTTLED = frozenset({
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "RequestThrottled",
    "TooManyRequestsException",
})
TRANSIENT = THROTTLED | {"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable"}
# Mistakes in clouds.aws of config.yaml: say which key to fix.
CONFIG_HINTS = {
    "InvalidAMIID.NotFound": "check clouds.aws.image_id for this region",
    "InvalidAMIID.Malformed": "check clouds.aws.image_id for this region",
    "InvalidSubnetID.NotFound": "check clouds.aws.subnet_id for this region",
    "InvalidGroup.NotFound": "check clouds.aws.security_group_ids for this region",
    "InvalidKeyPair.NotFound": "check clouds.aws.key_name for this region",
    "InvalidParameterValue": "check clouds.aws in config.yaml",
}

NOT_FOUND_CODES = frozenset({"InvalidInstanceID.NotFound"})


class AWSConfigError(ConfigError, ValueError):
    """``clouds.aws`` in config.yaml cannot be used; the message names the key and the fix."""


def error_code(exc: BaseException) -> str | None:
    """The AWS error code of a botocore ``ClientError``, or None for anything else."""
    if isinstance(exc, ClientError):
        return (exc.response.get("Error") or {}).get("Code")
    return None


def is_not_found(exc: BaseException) -> bool:
    """Whether ``exc`` says that an instance id does not exist (terminated long ago, or never was)."""
    return error_code(exc) in NOT_FOUND_CODES


def translate(exc: BaseException, action: str) -> ProviderError:
    """The neutral error for a botocore exception raised while doing ``action`` (e.g. "launch g4dn.xlarge")."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return AuthError(f"AWS {action}: no usable credentials found; {CREDENTIALS_FIX}")
    if isinstance(exc, NoRegionError):
        return ProviderError(f"AWS {action}: no region; list regions under clouds.aws.regions in config.yaml")
    if isinstance(exc, ClientError):
        return _translate_client_error(exc, action)
    if isinstance(exc, BotoCoreError):  # connection refused, timeouts, unreadable answers: transient
        return ProviderError(f"AWS {action}: {exc}; will retry")
    return ProviderError(f"AWS {action}: {type(exc).__name__}: {exc}")


def _translate_client_error(exc: ClientError, action: str) -> ProviderError:
    error = exc.response.get("Error") or {}
    code = error.get("Code") or "Unknown"
    message = (error.get("Message") or "").strip()
    said = f"AWS {action}: {code}" + (f": {message}" if message else "")
    if code in NO_CAPACITY:
        return NoCapacityError(said)
    if code in PRICE_TOO_LOW:
        return PriceTooLowError(said)
    if code in QUOTA:
        return QuotaError(f"{said}; raise the quota in the Service Quotas console or use another region")
    if code in BAD_CREDENTIALS:
        return AuthError(f"{said}; {CREDENTIALS_FIX}")
    if code in NOT_PERMITTED:
        return AuthError(f"{said}; {POLICY_FIX}")
    if code in TRANSIENT:
        return ProviderError(f"{said}; will retry")
    if code in CONFIG_HINTS:
        return ProviderError(f"{said}; {CONFIG_HINTS[code]}")
    return ProviderError(said)


def no_sdk_retry_of_no_capacity(response=None, **_) -> bool | None:
    """botocore ``needs-retry`` hook for RunInstances: never retry a no-capacity answer; let the runner fail over.

    EC2 sends InsufficientInstanceCapacity (and its kin) with HTTP 500, which botocore's standard mode would
    retry four times, sleeping about 7 s in all (up to 15 s), while the reconciler waits and the account's
    RunInstances rate is spent. ``False`` tells botocore not to retry; None leaves the decision to it.
    """
    parsed = response[1] if response else None  # None after a connection error: botocore's rules apply
    code = (parsed.get("Error") or {}).get("Code") if isinstance(parsed, dict) else None
    return False if code in NO_CAPACITY else None


@contextlib.contextmanager
def translated(action: str) -> Iterator[None]:
    """Run a block of AWS calls; any botocore exception leaves it as a neutral provider error."""
    try:
        yield
    except (BotoCoreError, ClientError) as exc:
        raise translate(exc, action) from exc
