"""Line coverage of policy modules by their unit tests (``portcullis policy test
--coverage``), from the covered and not covered lines regorus records.

A line counts once however many expressions it holds, as in ``opa test --coverage``.
Only policy modules count: the tests' own lines would lift the total without saying
anything about the policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FileCoverage:
    path: str
    covered: tuple[int, ...]
    not_covered: tuple[int, ...]

    @property
    def percent(self) -> float:
        return _percent(len(self.covered), len(self.not_covered))


@dataclass(frozen=True)
class Coverage:
    files: tuple[FileCoverage, ...]

    @property
    def covered_lines(self) -> int:
        return sum(len(file.covered) for file in self.files)

    @property
    def not_covered_lines(self) -> int:
        return sum(len(file.not_covered) for file in self.files)

    @property
    def percent(self) -> float:
        return _percent(self.covered_lines, self.not_covered_lines)


def coverage_of(lines: Mapping[str, tuple[Iterable[int], Iterable[int]]], policy_files: Iterable[str]) -> Coverage:
    """The coverage of ``policy_files`` from per-file (covered, not covered) lines. A
    file with no line to cover (a package of data only) is left out, as OPA does."""
    files = []
    for path in sorted(set(policy_files)):
        covered, not_covered = lines.get(path, ((), ()))
        hit, missed = sorted(set(covered)), sorted(set(not_covered))
        if hit or missed:
            files.append(FileCoverage(path, tuple(hit), tuple(missed)))
    return Coverage(tuple(files))


def line_ranges(lines: Iterable[int]) -> list[tuple[int, int]]:
    """Consecutive lines as (first, last) ranges: 12, 13, 14, 40 -> (12, 14), (40, 40)."""
    ranges: list[tuple[int, int]] = []
    for line in sorted(set(lines)):
        if ranges and line == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], line)
        else:
            ranges.append((line, line))
    return ranges


def render_ranges(lines: Iterable[int]) -> str:
    return ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in line_ranges(lines))


def report_lines(coverage: Coverage) -> list[str]:
    """The readable report: each file with its percent and the lines not covered."""
    if not coverage.files:
        return ["coverage: no policy module has a line to cover"]
    lines = []
    for file in coverage.files:
        missed = f" (not covered: {render_ranges(file.not_covered)})" if file.not_covered else ""
        lines.append(f"{file.path} {_shown(file.percent)}%{missed}")
    lines.append(f"coverage: {_shown(coverage.percent)}% ({coverage.covered_lines}/{coverage.covered_lines + coverage.not_covered_lines} lines)")
    return lines


def as_json(coverage: Coverage) -> dict[str, Any]:
    """OPA's coverage report shape (``opa test --coverage --format json``): per file the
    covered and not covered row ranges and counts, then the totals; plus plain line lists."""
    return {
        "files": {
            file.path: {
                "covered": _rows(file.covered),
                "not_covered": _rows(file.not_covered),
                "covered_lines": len(file.covered),
                "not_covered_lines": len(file.not_covered),
                "coverage": round(file.percent, 2),
                "lines": {"covered": list(file.covered), "not_covered": list(file.not_covered)},
            }
            for file in coverage.files
        },
        "covered_lines": coverage.covered_lines,
        "not_covered_lines": coverage.not_covered_lines,
        "coverage": round(coverage.percent, 2),
    }


def threshold_message(coverage: Coverage, threshold: float) -> str | None:
    """OPA's words when the total is under ``threshold`` percent, with the lines not
    covered; None when it is met."""
    if coverage.percent >= threshold:
        return None
    lines = [f"Code coverage threshold not met: got {coverage.percent:.2f} instead of {threshold:.2f}", "Lines not covered:"]
    for file in coverage.files:
        lines.extend(f"\t{file.path}:{first}" if first == last else f"\t{file.path}:{first}-{last}" for first, last in line_ranges(file.not_covered))
    return "\n".join(lines)


def _rows(lines: Iterable[int]) -> list[dict[str, dict[str, int]]]:
    return [{"start": {"row": first}, "end": {"row": last}} for first, last in line_ranges(lines)]


def _percent(covered: int, not_covered: int) -> float:
    total = covered + not_covered
    return 100.0 * covered / total if total else 100.0  # nothing to cover is not a gap


def _shown(percent: float) -> str:
    """87.5, 100, 33.33: two decimals at most, no trailing zeros."""
    return f"{percent:.2f}".rstrip("0").rstrip(".")
