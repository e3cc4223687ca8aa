"""Reading the gateway's metrics as Prometheus would: sample lines parsed, and sums by label."""

from __future__ import annotations

import re

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample line of a Prometheus text exposition, parsed."""
    found = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        found.append((match.group(1), dict(LABEL.findall(match.group(3) or "")), float(match.group(4))))
    return found


def value(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for n, found, v in samples(text) if n == name and all(found.get(k) == want for k, want in labels.items()))


def only(text: str, name: str, **labels: str) -> float:
    """The value of ``name``'s one sample with ``labels``; fails when there is none (where
    ``value`` would read a missing series as 0) or several."""
    found = [v for n, have, v in samples(text) if n == name and all(have.get(k) == want for k, want in labels.items())]
    assert len(found) == 1, f"{len(found)} samples of {name} with {labels}"
    return found[0]
