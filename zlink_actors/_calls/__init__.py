"""_calls: see docs/architecture.md."""
