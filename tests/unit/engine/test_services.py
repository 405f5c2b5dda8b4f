"""The tier-services registry (`_engine/services.py`): typed keys, provided once."""

from __future__ import annotations

import pytest

from zlink_actors import NotConfiguredError, SpotManager
from zlink_actors._calls.contexts import SPOT_MANAGER
from zlink_actors._engine.services import ServiceKey, Services
from zlink_actors.testing import HostHarness


def test_a_service_is_found_by_its_key() -> None:
    services = Services()
    key: ServiceKey[list[int]] = ServiceKey("numbers")
    numbers = [1, 2]
    services.provide(key, numbers)

    assert services.get(key) is numbers
    assert key in services


def test_a_missing_service_is_not_configured() -> None:
    with pytest.raises(NotConfiguredError, match="http is not configured on this Host"):
        Services().get(ServiceKey[object]("http"))


def test_a_key_is_provided_once() -> None:
    services = Services()
    key: ServiceKey[int] = ServiceKey("n")
    services.provide(key, 1)
    with pytest.raises(ValueError, match="n is already provided"):
        services.provide(key, 2)
    assert services.get(key) == 1


def test_the_host_provides_its_managers_and_contexts_find_them(harness: HostHarness) -> None:
    host = harness.host()
    manager = host._runtime.services.get(SPOT_MANAGER)
    assert isinstance(manager, SpotManager)
    assert host.spots is manager


def test_no_service_is_provided_once_sealed(harness: HostHarness) -> None:
    host = harness.host()
    with pytest.raises(ValueError, match="the services of this Host are sealed"):
        host._runtime.services.provide(ServiceKey[int]("late"), 1)
