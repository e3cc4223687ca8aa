"""With ``workers: N`` the supervisor serves the metrics listener, for every worker: each
worker pushes its snapshot over the state channel every ``PUSH_SECONDS`` (and once more
as it stops), and a scrape gets the latest of each, merged (``registry.merge``). A
scrape is therefore at most ``PUSH_SECONDS`` behind; counters never go back, since each
worker's own are cumulative and a replaced worker's last push stays counted under its
index until its successor's first push replaces it (a restart, as Prometheus sees it)."""

from __future__ import annotations

from portcullis.adapters.telemetry import prometheus
from portcullis.adapters.telemetry.registry import Snapshot, merge

PUSH_SECONDS = 2.0
METHODS = frozenset({"report"})


class MetricsBoard:
    def __init__(self) -> None:
        self._snapshots: dict[int, Snapshot] = {}

    async def report(self, worker: int, snapshot: Snapshot) -> None:
        self._snapshots[worker] = snapshot

    def render(self) -> str:
        return prometheus.render(merge(self._snapshots[index] for index in sorted(self._snapshots)))
