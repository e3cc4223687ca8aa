"""The ledger's interface: atomic reservation, idempotent settlement, reconciliation.

Both implementations keep the same invariant for every hard limit: a counter's value
(settled spend plus open reservations) never passes its limit, because a request is
only dispatched after its conservative bound was added to every counter it charges
in one all-or-nothing step.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Protocol

from portcullis.adapters.json_bytes import compact
from portcullis.engine.governance import Bound, Charge, Verdict, reached_thresholds


@dataclass(frozen=True)
class Reservation:
    id: str  # the request id for a main call, "<request id>:<name>" for a sub-call
    request_id: str
    subcall: str
    principal: dict[str, Any]
    charges: tuple[Charge, ...]
    bound: Bound
    created_at: dt.datetime

    def charge_records(self) -> list[dict[str, Any]]:
        return [charge.as_record() for charge in self.charges]

    def charges_json(self) -> str:
        return compact(self.charge_records()).decode()

    def open_row(self) -> tuple[Any, ...]:
        """The values of ``RESERVATION_COLUMNS`` for this reservation as first recorded:
        open, charged its bound until a settlement replaces it."""
        principal, bound = self.principal, self.bound
        return (
            self.id,
            self.request_id,
            self.subcall,
            principal.get("team"),
            principal.get("user"),
            principal.get("key_id"),
            "open",
            self.charges_json(),
            bound.tokens,
            bound.cost_micro_usd,
            bound.estimate,
            bound.tokens,
            bound.cost_micro_usd,
            self.created_at,
        )


RESERVATION_COLUMNS = (
    "id",
    "request_id",
    "subcall",
    "team",
    "user_id",
    "key_id",
    "state",
    "charges",
    "bound_tokens",
    "bound_micro_usd",
    "estimate",
    "tokens",
    "cost_micro_usd",
    "created_at",
)


def insert_reservation_sql(placeholder: str) -> str:
    """The statement that records ``Reservation.open_row``, in a driver's placeholder style."""
    return f"INSERT INTO reservations ({', '.join(RESERVATION_COLUMNS)}) VALUES ({', '.join([placeholder] * len(RESERVATION_COLUMNS))})"


@dataclass(frozen=True)
class Outcome:
    """How a settlement left the ledger: the state, and budget thresholds it crossed
    for the first time in their period (each fires once)."""

    state: str
    replayed: bool = False
    thresholds: tuple[tuple[str, int], ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Unresolved:
    """A reservation no settlement completed: a stream that ended without final usage
    (pending), or a process that died between reserve and settle (open)."""

    id: str
    request_id: str
    state: str
    charges: list[dict[str, Any]]
    bound_tokens: int
    bound_micro_usd: int
    usage: dict[str, Any] | None
    served: dict[str, Any] | None
    created_at: dt.datetime


class Ledger(Protocol):
    async def reserve(self, reservation: Reservation, fail_open: bool = False) -> Verdict:
        """Record the reservation durably and add every charge to its counter if all stay
        within their limits; a refused reservation holds nothing. When the counters cannot
        be reached: with ``fail_open`` the recorded reservation is admitted unmetered,
        otherwise it is refused and ``StoreUnavailable`` raised."""
        ...

    async def settle(self, reservation_id: str, charges: list[dict[str, Any]], final: Final) -> Outcome:
        """Replace a reservation's charges with final amounts. Safe to replay: only the
        first settlement of a reservation changes anything."""
        ...

    async def unresolved(self, older_than: dt.datetime) -> list[Unresolved]: ...

    async def peaks(self, keys: list[str]) -> dict[str, int]:
        """The highest value each counter instance has held (its high-water mark), for
        the instances that exist; one call whatever the number of keys. Reservations and
        settlements raise it in the same atomic step that moves the counter, so it is
        never below any value the counter held."""
        ...

    async def values(self, keys: list[str]) -> dict[str, int]:
        """Each counter instance's current value (settled amounts plus open reservations,
        what a reservation is judged against), for the calendar instances that exist;
        one call whatever the number of keys (the budget utilisation gauge's read)."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class Final:
    """What a reservation ends up charging."""

    state: str  # settled | pending | released | reconciled
    tokens: int
    cost_micro_usd: int
    amounts: dict[str, int]  # counter key -> final amount
    usage: dict[str, Any] | None = None
    served: dict[str, Any] | None = None
    note: str | None = None  # a reconciliation's reason


def settle_deltas(charges: list[dict[str, Any]], amounts: dict[str, int]) -> dict[str, int]:
    """What each counter moves by when the charges are replaced with final amounts."""
    return {charge["key"]: amounts.get(charge["key"], charge["amount"]) - charge["amount"] for charge in charges}


def thresholds_reached(charges: list[dict[str, Any]], values: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """(counter, threshold) for every budget threshold the counters' ``values`` have
    reached, each once; which of them fire for the first time is the store's to say."""
    by_key: dict[str, dict[str, Any]] = {}
    for charge in charges:
        by_key.setdefault(charge["key"], charge)
    return list(dict.fromkeys((key, threshold) for key, value in values for threshold in reached_thresholds(by_key[key], value)))


def epoch_ms(when: dt.datetime) -> int:
    """A reservation's time as rate windows key their entries: milliseconds since the epoch."""
    return int(when.timestamp() * 1000)
