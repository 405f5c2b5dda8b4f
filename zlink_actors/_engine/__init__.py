"""_engine: see docs/architecture.md."""
