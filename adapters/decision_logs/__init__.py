"""Decision logs in Open Policy Agent's decision-log format (docs/operations.md#decision-logs)."""
