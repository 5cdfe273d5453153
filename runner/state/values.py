"""The typed values the controller keeps in JSON columns: a node's ``Offer``, an attempt's ``Notice``.

The state layer decodes them when it reads a row, so the scheduler, the controller and the web page use
attributes, never keys. Each turns back into exactly the JSON it was stored as (``to_json``): the columns
keep the same text, with no migration.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Offer:
    """One launchable node type in one zone, with its prices in USD per hour."""

    cloud: str
    region: str
    zone: str
    instance_type: str
    accelerator: str | None  # e.g. "T4"; None for CPU only
    accelerator_count: int
    cpus: int
    memory_gb: float
    spot_price: float | None  # None when the type has no spot market there
    on_demand_price: float

    def price(self, spot: bool) -> float | None:
        """The hourly price that applies to a spot or an on-demand launch."""
        return self.spot_price if spot else self.on_demand_price

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Offer:
        """The stored offer; a key a newer version added is set aside."""
        return cls(**{key: value for key, value in data.items() if key in _OFFER_FIELDS})


_OFFER_FIELDS = frozenset(Offer.__dataclass_fields__)
_NOTICE_FIELDS = ("source", "kind", "action", "received_at", "deadline", "terminal", "id", "node_rank")


@dataclass(frozen=True)
class Notice:
    """The preemption notice an attempt's node received, as the restart log shows it (docs/restart-log.md):
    ``source`` (aws, gcp, azure, signal), ``kind``, ``action`` (the cloud's word), ``received_at`` and
    ``deadline`` (ISO-8601 text, ``deadline`` None when the cloud gives none), ``terminal``, ``id``; of a
    gang, ``node_rank``. Whatever else the agent reported is kept in ``extra`` and shown as it came."""

    source: str | None = None
    kind: str | None = None
    action: str | None = None
    received_at: str | None = None
    deadline: str | None = None
    terminal: bool | None = None
    id: str | None = None
    node_rank: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] = ()  # every key the report had, in its order (a missing one is not shown as null)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Notice:
        known = {key: data[key] for key in _NOTICE_FIELDS if key in data}
        extra = {key: value for key, value in data.items() if key not in _NOTICE_FIELDS}
        return cls(**known, extra=extra, keys=tuple(data))

    def __bool__(self) -> bool:
        return bool(self.keys)  # an empty report is no notice, as its empty JSON object was

    def with_rank(self, rank: int) -> Notice:
        """The notice of one node of a gang."""
        keys = self.keys if "node_rank" in self.keys else (*self.keys, "node_rank")
        return Notice(**{**{k: getattr(self, k) for k in _NOTICE_FIELDS}, "node_rank": rank},
                      extra=self.extra, keys=keys)

    def to_json(self) -> dict:
        """The notice as it was reported, in its keys' order."""
        return {key: self.extra[key] if key in self.extra else getattr(self, key) for key in self.keys}
