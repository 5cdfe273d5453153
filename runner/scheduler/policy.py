"""The offer policy: which offers fit a job, in which order to try them, and why none ever will.

Pure functions of offers, the job's resources and an injected clock; no provider or database here.

- An offer fits when its accelerator name (any case) and count are exactly the requested ones (a job
  without accelerators fits CPU-only offers only), it has at least the requested cpus and memory_gb,
  its cloud is allowed, its region (or zone) is in ``regions``, it has a spot market when the job
  wants spot only, and a price that applies is within ``max_price_per_hour``.
- Candidates are ordered: zones to avoid last, spot before on-demand (spot_policy auto), then by price,
  then cloud, region, zone and instance type, so the same inputs always give the same order.
- Offers backed off after a capacity error (their type in their zone, or their whole zone) are left
  out until the backoff expires; see :class:`BackoffBook`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, NamedTuple

from ..providers.offers import Offer
from ..spec.schema import Resources
from .isolation import capped_doubling

CONSTRAINTS = ("accelerators", "cpus", "memory_gb", "cloud", "regions", "spot_policy", "max_price_per_hour")
# explain_unsatisfiable blames the first of these that alone keeps offers out: the likeliest to be relaxed
BLAME_ORDER = ("max_price_per_hour", "spot_policy", "regions", "cloud", "memory_gb", "cpus", "accelerators")
BACKOFF_BASE_SECONDS = 30.0
BACKOFF_CAP_SECONDS = 30 * 60.0
ZONE_AFTER_TYPES = 2  # this many types backed off at once in one zone back off the zone itself


class Candidate(NamedTuple):
    """One way to launch a job: an offer, in the spot or the on-demand market, at that market's price."""

    offer: Offer
    spot: bool
    price: float


# --- fitting ---------------------------------------------------------------------------------------


def fits(offer: Offer, resources: Resources) -> str | None:
    """None when ``offer`` can run a job with these resources, else the first constraint it fails."""
    failed = _failures(offer, resources)
    return failed[0] if failed else None


def _failures(offer: Offer, resources: Resources) -> list[str]:
    """Every constraint ``offer`` fails, in the order of CONSTRAINTS."""
    failed = [name for name, ok in (
        ("accelerators", _accelerators_match(offer, resources.accelerator_options())),
        ("cpus", resources.cpus is None or offer.cpus >= resources.cpus),
        ("memory_gb", resources.memory_gb is None or offer.memory_gb >= resources.memory_gb),
        ("cloud", not resources.cloud or offer.cloud in resources.cloud),
        ("regions", not resources.regions or offer.region in resources.regions or offer.zone in resources.regions),
        ("spot_policy", resources.spot_policy != "spot" or offer.spot_price is not None),
    ) if not ok]
    cap = resources.max_price_per_hour
    prices = [price for _, price in _markets(offer, resources.spot_policy, on_demand_fallback=True)]
    if cap is not None and prices and min(prices) > cap:
        failed.append("max_price_per_hour")
    return failed


def _accelerators_match(offer: Offer, wanted: list[tuple[str, int]]) -> bool:
    """Whether the offer has one of the wanted (name, count) alternatives; [] wants a CPU-only offer."""
    if not wanted:
        return offer.accelerator is None
    return offer.accelerator is not None and any(
        offer.accelerator.upper() == name.upper() and offer.accelerator_count == count for name, count in wanted)


def _markets(offer: Offer, spot_policy: str, on_demand_fallback: bool) -> list[tuple[bool, float]]:
    """(spot, price) for each market the policy allows and the offer has."""
    wanted = {"spot": [True], "on-demand": [False]}.get(spot_policy, [True, False] if on_demand_fallback else [True])
    return [(spot, offer.price(spot)) for spot in wanted if offer.price(spot) is not None]


# --- ranking ---------------------------------------------------------------------------------------


def rank_offers(offers: Iterable[Offer], resources: Resources, *, avoid_zones: set[str] | frozenset = frozenset(),
                backoff: "BackoffBook | None" = None, now: float, on_demand_fallback: bool = False,
                on_demand_backoff: "BackoffBook | None" = None) -> list[Candidate]:
    """Every launchable candidate for a job, best first; empty when nothing fits or all is backed off.

    spot_policy ``spot`` gives spot candidates only and ``on-demand`` on-demand ones; ``auto`` gives spot
    candidates, followed by on-demand ones when ``on_demand_fallback`` is true. Zones in ``avoid_zones``
    (they preempted this job recently) come after every other zone rather than vanishing.

    ``backoff`` holds capacity errors of spot launches; ``on_demand_backoff``, when given, those of
    on-demand launches, which draw on another capacity pool (a spot stockout does not block on-demand).
    Without it, ``backoff`` applies to both markets.
    """
    cap = resources.max_price_per_hour
    candidates = []
    for offer in offers:
        if any(c != "max_price_per_hour" for c in _failures(offer, resources)):
            continue
        for spot, price in _markets(offer, resources.spot_policy, on_demand_fallback):
            book = backoff if spot or on_demand_backoff is None else on_demand_backoff
            if book is not None and book.blocks(offer, now):
                continue
            if cap is None or price <= cap:
                candidates.append(Candidate(offer, spot, price))
    return sorted(candidates, key=lambda c: (c.offer.zone in avoid_zones, not c.spot, c.price, _place(c.offer)))


def _place(offer: Offer) -> tuple:
    return (offer.cloud, offer.region, offer.zone, offer.instance_type)


def filter_offers(offers: Iterable[Offer], accelerators: str | list[str] | None = None, cloud: str | None = None,
                  on_demand: bool = False) -> list[Offer]:
    """Offers with any of these accelerators (each ``NAME:N``, or ``NAME`` for any count) on this cloud,
    cheapest first.

    Ordered by spot price (offers without a spot market last), or by on-demand price when ``on_demand``.
    """
    offers = list(offers)
    texts = [accelerators] if isinstance(accelerators, str) else list(accelerators or [])
    wanted = [_parse_accelerators(text) for text in texts]
    known = _known_accelerators(offers) if wanted else []
    for text, (name, _) in zip(texts, wanted):
        if name.upper() not in {k.upper() for k in known}:
            raise ValueError(f"accelerators {text}: unknown accelerator {name!r}; "
                             f"known accelerators are {', '.join(known)}")
    chosen = [o for o in offers if (cloud is None or o.cloud == cloud) and (
        not wanted or (o.accelerator is not None and any(
            o.accelerator.upper() == name.upper() and count in (None, o.accelerator_count) for name, count in wanted)))]

    def key(offer: Offer):
        price = offer.on_demand_price if on_demand else offer.spot_price
        return (price is None, price if price is not None else offer.on_demand_price, _place(offer))

    return sorted(chosen, key=key)


def _parse_accelerators(text: str) -> tuple[str, int | None]:
    match = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9_.-]*)\s*(?::\s*([1-9][0-9]*))?\s*", text)
    if not match:
        raise ValueError(f"accelerators {text!r} is not NAME:COUNT (for example T4:1 or A100:8) or NAME")
    return match.group(1), int(match.group(2)) if match.group(2) else None


# --- explaining ------------------------------------------------------------------------------------

CLOUD_GUIDES = ("aws", "gcp")  # clouds whose setup has its page in docs/


def explain_unsatisfiable(offers: Iterable[Offer], resources: Resources) -> str | None:
    """None when some offer can run the job; else one line naming the constraint at fault and the
    cheapest offer that would fit without it (backoffs are ignored: this is about ever, not now)."""
    offers = list(offers)
    if not offers:
        return "no cloud offers anything; configure a cloud under clouds: in $RUNNER_HOME/config.yaml"
    options = resources.accelerator_options()
    wanted = options[0] if options else None
    known = _known_accelerators(offers) if options else []
    for name, _ in options:
        if name.upper() not in {k.upper() for k in known}:
            return (f"accelerators {resources.accelerators_text()}: unknown accelerator {name!r}; "
                    f"known accelerators are {', '.join(known)}")
    scored = [(offer, _failures(offer, resources)) for offer in offers]
    if any(not failed for _, failed in scored):
        return None
    for name in BLAME_ORDER:
        only = [offer for offer, failed in scored if failed == [name]]
        if name == "accelerators":
            if any(_accelerators_match(o, options) for o in offers):
                continue  # the accelerators are offered; what keeps them out is something else
            if options:
                names = {name.upper() for name, _ in options}
                only = [o for o in only if (o.accelerator or "").upper() in names] or only
        if only:
            best = min(only, key=lambda o: _cheapness(o, resources))
            return f"{_reason(name, resources, offers)}; {_cheapest_instead(name, best)} {_describe(best, resources.spot_policy)}"
    right_kind = [(o, f) for o, f in scored if "accelerators" not in f] or scored
    closest, failed = min(right_kind, key=lambda s: (len(s[1]), _cheapness(s[0], resources)))
    kind = ("offer" if "accelerators" in failed else "CPU-only offer" if wanted is None
            else f"offer with accelerators {resources.accelerators_text()}")
    return (f"no {kind} meets {' and '.join(_constraint(resources, c) for c in failed)}; "
            f"the closest is {_describe(closest, resources.spot_policy)}; relax one of them")


def _cheapest_instead(constraint: str, offer: Offer) -> str:
    """How to name the cheapest offer that fits but for ``constraint``."""
    if constraint == "max_price_per_hour":
        return "the cheapest is"
    if constraint == "accelerators" and offer.accelerator:
        return f"the cheapest {offer.accelerator}:{offer.accelerator_count} offer is"
    return "the cheapest offer that meets everything else is"


def _cheapness(offer: Offer, resources: Resources) -> tuple:
    return (_display_price(offer, resources.spot_policy)[0], _place(offer))


def _known_accelerators(offers: list[Offer]) -> list[str]:
    names = {o.accelerator for o in offers if o.accelerator}
    try:
        from ..providers.catalog import known_accelerators
        names.update(known_accelerators())
    except (ImportError, ValueError):  # a missing or broken catalog only narrows the list of names
        pass
    unique = {n.upper(): n for n in sorted(names)}
    return sorted(unique.values(), key=str.upper)


def _constraint(resources: Resources, name: str) -> str:
    value = {"cloud": ",".join(resources.cloud or []), "regions": ",".join(resources.regions or []),
             "accelerators": resources.accelerators_text()}.get(name, getattr(resources, name))
    if name == "max_price_per_hour":
        value = _money(value)
    elif isinstance(value, float):
        value = f"{value:g}"
    return f"{name} {value if value is not None else 'none'}"


def _reason(name: str, resources: Resources, offers: list[Offer]) -> str:
    if name == "accelerators":
        options = resources.accelerator_options()
        if not options:
            return "accelerators: none requested, and no CPU-only offer fits; request accelerators to use GPU types"
        names = {name.upper() for name, _ in options}
        same = [o for o in offers if (o.accelerator or "").upper() in names]
        text = resources.accelerators_text()
        if not same:
            return f"accelerators {text}: no configured cloud offers {' or '.join(n for n, _ in options)}"
        kinds = sorted({(o.accelerator, o.accelerator_count) for o in same})
        spelled = ", ".join(f"{name}:{count}" for name, count in kinds)
        return f"accelerators {text} is not offered (offered as {spelled})" if len(options) > 1 else \
            f"accelerators {text} is not offered ({same[0].accelerator} comes as {spelled})"
    if name in ("cpus", "memory_gb"):
        most = max(getattr(o, name) for o in offers if _failures(o, resources) == [name])
        return f"{_constraint(resources, name)} is more than every fitting offer has (at most {most:g})"
    if name == "cloud":
        configured = {o.cloud for o in offers}
        missing = [c for c in resources.cloud or [] if c not in configured]
        if missing:
            guides = ", ".join(f"docs/{c}.md" for c in missing if c in CLOUD_GUIDES)
            return (f"cloud {','.join(missing)} is not configured: add it under clouds: in the controller's "
                    f"config.yaml" + (f" (how: {guides})" if guides else ""))
        return f"cloud {','.join(resources.cloud or [])} has no fitting offer"
    if name == "regions":
        return f"regions {','.join(resources.regions or [])} have no fitting offer"
    if name == "spot_policy":
        return "spot_policy spot, but no fitting offer has a spot market (use spot_policy auto or on-demand)"
    return f"{_constraint(resources, name)} is below every fitting offer"


def _display_price(offer: Offer, spot_policy: str) -> tuple[float, str]:
    """The price a job with this policy would pay, and its market's name."""
    if spot_policy != "on-demand" and offer.spot_price is not None:
        return offer.spot_price, "spot"
    return offer.on_demand_price, "on-demand"


def _describe(offer: Offer, spot_policy: str) -> str:
    price, market = _display_price(offer, spot_policy)
    return f"{offer.instance_type} in {offer.zone} at ${_money(price)}/h {market}"


def _money(value: float) -> str:
    return f"{value:.2f}" if round(value, 2) == value else f"{value:.4g}"


# --- backoff ---------------------------------------------------------------------------------------


@dataclass
class _Backoff:
    failures: int
    until: float


class BackoffBook:
    """Exponential backoff of (cloud, zone, instance_type) and (cloud, zone) keys after capacity errors.

    Shared by every job. Each failure doubles the key's backoff from ``base`` up to ``cap`` seconds; a
    success clears it (a success of a type also clears its zone). A key whose backoff ended more than
    ``cap`` seconds ago starts again from ``base``. When ZONE_AFTER_TYPES types of one zone are backed
    off at once, the zone itself is backed off too. Time is passed in (``now``, seconds), never read.
    """

    def __init__(self, base: float = BACKOFF_BASE_SECONDS, cap: float = BACKOFF_CAP_SECONDS):
        if not 0 < base <= cap:
            raise ValueError(f"backoff base {base} and cap {cap}: need 0 < base <= cap")
        self.base = float(base)
        self.cap = float(cap)
        self._entries: dict[tuple[str, ...], _Backoff] = {}

    def record_failure(self, key: Iterable[str], now: float) -> float:
        """Back ``key`` off after a capacity error at ``now``; returns the backoff in seconds."""
        key = _key(key)
        self.prune(now)
        entry = self._entries.get(key)
        failures = entry.failures + 1 if entry is not None else 1
        seconds = capped_doubling(self.base, failures, self.cap)  # any count: 10,000 failures must not overflow
        self._entries[key] = _Backoff(failures, now + seconds)
        if len(key) == 3:
            zone = key[:2]
            types_out = sum(1 for k in self._entries if len(k) == 3 and k[:2] == zone and self.is_backed_off(k, now))
            if types_out >= ZONE_AFTER_TYPES and not self.is_backed_off(zone, now):
                self.record_failure(zone, now)
        return seconds

    def record_success(self, key: Iterable[str], now: float) -> None:
        """Forget ``key``'s failures (and its zone's, for a type) after a successful launch."""
        key = _key(key)
        self._entries.pop(key, None)
        if len(key) == 3:
            self._entries.pop(key[:2], None)
        self.prune(now)

    def is_backed_off(self, key: Iterable[str], now: float) -> bool:
        """Whether ``key`` must not be tried at ``now``."""
        return self.remaining(key, now) > 0

    def remaining(self, key: Iterable[str], now: float) -> float:
        """Seconds until ``key`` may be tried again (0 when it may now)."""
        entry = self._entries.get(_key(key))
        return max(0.0, entry.until - now) if entry is not None else 0.0

    def blocks(self, offer: Offer, now: float) -> bool:
        """Whether the offer's type in its zone, or its whole zone, is backed off at ``now``."""
        return (self.is_backed_off((offer.cloud, offer.zone, offer.instance_type), now)
                or self.is_backed_off((offer.cloud, offer.zone), now))

    def prune(self, now: float) -> None:
        """Drop keys whose backoff ended more than ``cap`` seconds before ``now``."""
        for key in [k for k, e in self._entries.items() if now - e.until > self.cap]:
            del self._entries[key]

    def to_dict(self) -> dict:
        """A JSON-ready form, read back by :meth:`from_dict`."""
        return {"base": self.base, "cap": self.cap, "entries": [
            {"key": list(k), "failures": e.failures, "until": e.until} for k, e in sorted(self._entries.items())]}

    @classmethod
    def from_dict(cls, data: dict) -> "BackoffBook":
        """The book that :meth:`to_dict` described."""
        try:
            book = cls(data.get("base", BACKOFF_BASE_SECONDS), data.get("cap", BACKOFF_CAP_SECONDS))
            for item in data.get("entries", []):
                book._entries[_key(item["key"])] = _Backoff(int(item["failures"]), float(item["until"]))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"backoff book: malformed data ({exc!r}); expected the form to_dict() writes, "
                             "or delete the stored book to start afresh") from exc
        return book

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BackoffBook) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"BackoffBook({len(self._entries)} keys)"


def _key(key: Iterable[str]) -> tuple[str, ...]:
    key = tuple(str(part) for part in key)
    if len(key) not in (2, 3):
        raise ValueError(f"backoff key {key!r}: use (cloud, zone) or (cloud, zone, instance_type)")
    return key
