"""What each ``audit.fsync`` policy costs one record, side by side in one run on one disk.

    .venv/bin/python bench/audit_fsync.py [--records 20000] [--rounds 2] [--directory DIR]

Appends records of about 300 bytes (a request_started record's size) to a fresh log in
``DIR`` (default: a temporary directory under the current one, so on the disk the
gateway's ``.portcullis/`` would be on), with ``never``, ``interval`` (the upkeep tick
that forces the file runs as in the gateway: once per ``fsync_interval_seconds``, on a
thread) and ``always``, in rounds so the disk's noise shows. ``always`` writes a tenth of
the records: each costs a disk flush. Printed: µs per record and records per second.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from portcullis.adapters.audit_log import AuditLog, AuditWriting

FIELDS = {
    "request_id": "req_18ed7efd5433517615a76e7352a0",
    "principal": {"key_id": "key_0123456789abcdef", "team": "payments", "user": "alice"},
    "protocol": "anthropic_messages",
    "model": "claude-sonnet-4-5",
    "bundle": {"revision": "2026-12-01.3", "digest": "0" * 64},
}


async def measure(directory: Path, policy: str, records: int) -> float:
    """µs per record appended under ``policy``, the interval sync running beside it."""
    path = directory / f"audit-{policy}-{time.monotonic_ns()}.jsonl"
    log = AuditLog(path, writing=AuditWriting(rotate_bytes=0, fsync=policy, fsync_interval=1.0))  # type: ignore[arg-type]
    ticking = asyncio.ensure_future(_tick(log)) if policy == "interval" else None
    try:
        started = time.perf_counter()
        for n in range(records):
            log.append("request_started", n=n, **FIELDS)
            if n % 500 == 0:
                await asyncio.sleep(0)  # the loop runs its other work, the sync among it
        elapsed = time.perf_counter() - started
    finally:
        if ticking is not None:
            ticking.cancel()
        log.close()
    return elapsed / records * 1e6


async def _tick(log: AuditLog) -> None:
    while True:
        await asyncio.sleep(0.05)  # the gateway ticks each second; here the run lasts well under one
        await log.tick()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--directory", type=Path, default=Path.cwd())
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.directory, prefix="audit-fsync-") as scratch:
        print(f"audit.fsync, {args.records} records of ~300 bytes (always: {args.records // 10}), in {scratch}")
        print(f"{'round':>5}  {'policy':<9} {'µs/record':>10} {'records/s':>11}")
        for round_number in range(1, args.rounds + 1):
            for policy in ("never", "interval", "always"):
                count = args.records // 10 if policy == "always" else args.records
                micros = await measure(Path(scratch), policy, count)
                print(f"{round_number:>5}  {policy:<9} {micros:>10.1f} {1e6 / micros:>11,.0f}")


if __name__ == "__main__":
    asyncio.run(main())
