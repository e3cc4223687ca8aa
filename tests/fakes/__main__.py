"""``python -m tests.fakes --port N``: the fake provider on its own, for the benchmark.
``--pods K``: a pool of K fake pods on ports N … N+K-1 (``pods``), each with its
``/metrics`` set by ``PUT /fake/metrics``."""

from __future__ import annotations

import argparse
import threading

import uvicorn

from tests.fakes import FakeProvider, Reply
from tests.fakes.pods import FakePods


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the fake provider on its own (benchmarks).")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api-key", default="sk-fake-upstream")
    parser.add_argument("--echo", action="store_true", help="answer every request with its last user message")
    parser.add_argument("--unsigned-bedrock", action="store_true", help="answer Bedrock requests without checking SigV4 (wrk cannot sign)")
    parser.add_argument("--pods", type=int, default=0, help="run a pool of this many fake pods on consecutive ports")
    args = parser.parse_args()
    if args.pods:
        pool = FakePods(args.pods, args.api_key)
        for i, pod in enumerate(pool.pods):
            pod.start(args.port + i)
        print(" ".join(pool.endpoints), flush=True)
        threading.Event().wait()  # until interrupted; the pods run on daemon threads
        return
    fake = FakeProvider(args.api_key, default=Reply(echo=True) if args.echo else None)
    fake.aws.verifies = not args.unsigned_bedrock
    uvicorn.run(fake.app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False, lifespan="off", http="httptools", loop="uvloop")


if __name__ == "__main__":
    main()
