"""deploy/ checked offline: the kustomize renders, their schemas and security settings, the wiring, the image."""
