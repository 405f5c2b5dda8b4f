"""_core: see docs/architecture.md."""
