"""Everything that touches the world: protocols, providers, stores, the audit log,
the HTTP application and the command line."""
