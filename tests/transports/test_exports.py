"""The public names of `transports`: `__all__` is complete and sorted."""

from __future__ import annotations

import transports


def test_all_is_sorted_and_names_every_public_member() -> None:
    public = {name for name in dir(transports) if not name.startswith("_")}
    assert transports.__all__ == sorted(transports.__all__)
    assert set(transports.__all__) == public
