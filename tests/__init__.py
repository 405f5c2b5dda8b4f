"""The test suite (a package, so that tests/transports never shadows the top-level `transports`)."""
