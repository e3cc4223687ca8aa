"""Routing layer L4's facts: the request's features and the session's pinned tier."""
