"""Offers: what a provider can launch, at what price (the type lives with the rows that store it)."""

from __future__ import annotations

from ..state.values import Offer

__all__ = ["Offer"]
