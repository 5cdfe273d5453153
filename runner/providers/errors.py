"""Neutral provider errors: each cloud translates its own errors into these, once."""

from __future__ import annotations

from ..errors import CloudError


class ProviderError(CloudError):
    """A provider operation failed; ``retryable`` says whether another offer may succeed."""

    retryable = True


class NoCapacityError(ProviderError):
    """The zone has no capacity for this type right now: try another offer."""


class QuotaError(ProviderError):
    """An account quota stops the launch: try another offer; the user may need to raise it."""


class PriceTooLowError(ProviderError):
    """The spot price exceeds the maximum price: try another offer."""


class AuthError(ProviderError):
    """Credentials or permissions are missing: stop retrying and tell the user what to fix."""

    retryable = False
