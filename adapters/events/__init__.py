"""Events the gateway reports to operators' endpoints."""
