"""``python -m tests.fakes --port N``: the fake provider on its own, for the benchmark."""

from __future__ import annotations

import argparse

import uvicorn

from tests.fakes import FakeProvider, Reply


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the fake provider on its own (benchmarks).")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api-key", default="sk-fake-upstream")
    parser.add_argument("--echo", action="store_true", help="answer every request with its last user message")
    parser.add_argument("--unsigned-bedrock", action="store_true", help="answer Bedrock requests without checking SigV4 (wrk cannot sign)")
    args = parser.parse_args()
    fake = FakeProvider(args.api_key, default=Reply(echo=True) if args.echo else None)
    fake.aws.verifies = not args.unsigned_bedrock
    uvicorn.run(fake.app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False, lifespan="off", http="httptools", loop="uvloop")


if __name__ == "__main__":
    main()
