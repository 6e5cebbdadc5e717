"""`MAGNETAR_EVENT_LOOP` picks the standalone broker's event loop: the standard one by default,
uvloop on request, and a clear configuration error for anything else."""

from __future__ import annotations

import asyncio
import sys

import pytest

from magnetar.broker._errors import ConfigurationError
from magnetar.broker.cli._standalone import EVENT_LOOP_ENV, event_loop_factory


def test_the_standard_loop_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)
    assert event_loop_factory() is asyncio.new_event_loop


def test_an_unknown_loop_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EVENT_LOOP_ENV, "trio")
    with pytest.raises(ConfigurationError, match="MAGNETAR_EVENT_LOOP=trio: expected"):
        event_loop_factory()


def test_uvloop_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EVENT_LOOP_ENV, "uvloop")
    loop = event_loop_factory()()  # the bench and test extras install uvloop
    try:
        assert type(loop).__module__.startswith("uvloop")
    finally:
        loop.close()


def test_uvloop_missing_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EVENT_LOOP_ENV, "uvloop")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed
    with pytest.raises(ConfigurationError, match="uvloop is not installed"):
        event_loop_factory()
