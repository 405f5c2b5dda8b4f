"""Generations: counters that never wrap."""

from __future__ import annotations

from typing import Final

from .._core.errors import CapacityExceededError

__all__ = ["MAX_GENERATION", "GenerationExhausted", "GenerationExhaustedError", "next_generation"]

#: The largest generation (a signed 64-bit integer, as the upstream wire carries it).
MAX_GENERATION: Final = 2**63 - 1


class GenerationExhaustedError(CapacityExceededError):
    """A generation counter reached `MAX_GENERATION`: it never wraps to reuse a value."""


#: The digest's name for the same error.
GenerationExhausted = GenerationExhaustedError


def next_generation(current: int, what: str) -> int:
    """`current + 1`, or `GenerationExhaustedError` at the end of the range."""
    if current >= MAX_GENERATION:
        raise GenerationExhaustedError(f"the {what} generation is exhausted at {current}")
    return current + 1
