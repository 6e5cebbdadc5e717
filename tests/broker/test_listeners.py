"""`_listeners.py`: parsing and checking `advertised_listeners` the way Pulsar's validator does,
and which URLs a lookup naming a listener answers."""

from __future__ import annotations

import pytest

from magnetar.broker import BrokerConfig
from magnetar.broker._listeners import (
    AdvertisedListener,
    ListenerNotFoundError,
    check_tls,
    listeners_of,
    parse_listeners,
)

INTERNAL = "internal:pulsar://10.0.0.5:6650"
EXTERNAL = "external:pulsar://broker.example.com:6650"


def test_items_become_named_listeners_and_the_first_is_internal() -> None:
    listeners = parse_listeners((INTERNAL, EXTERNAL, "external:pulsar+ssl://example.com:6651"))
    assert listeners.internal_name == "internal"
    assert listeners.internal == AdvertisedListener("internal", "pulsar://10.0.0.5:6650")
    assert listeners.by_name["external"] == AdvertisedListener(
        "external", "pulsar://broker.example.com:6650", "pulsar+ssl://example.com:6651")


def test_the_internal_listener_can_be_named() -> None:
    assert parse_listeners((INTERNAL, EXTERNAL), "external").internal_name == "external"


def test_spaces_around_items_are_ignored() -> None:
    listeners = parse_listeners((" internal : pulsar://10.0.0.5:6650 ",))
    assert listeners.by_name["internal"].broker_url == "pulsar://10.0.0.5:6650"


def test_no_items_no_listeners_and_the_internal_name_alone_is_ignored() -> None:
    listeners = parse_listeners((), "internal")
    assert dict(listeners.by_name) == {}
    assert listeners.internal is None


@pytest.mark.parametrize(("items", "internal", "message"), [
    (("pulsar://10.0.0.5:6650",), "", "does not name its listener"),
    ((":pulsar://10.0.0.5:6650",), "", "does not name its listener"),
    (("internal",), "", "does not name its listener"),
    (("internal:http://10.0.0.5:8080",), "", "is not NAME:pulsar://HOST:PORT"),
    (("internal:pulsar://10.0.0.5",), "", "is not NAME:pulsar://HOST:PORT"),
    (("internal:pulsar://:6650",), "", "is not NAME:pulsar://HOST:PORT"),
    (("internal:pulsar://10.0.0.5:port",), "", "'internal:pulsar://10.0.0.5:port'"),
    (("internal:pulsar://10.0.0.5:70000",), "", "'internal:pulsar://10.0.0.5:70000'"),
    (("internal:pulsar://10.0.0.5:6650/path",), "", "is not NAME:pulsar://HOST:PORT"),
    ((INTERNAL, "internal:pulsar://10.0.0.6:6650"), "", "more than one pulsar:// URL"),
    ((INTERNAL, "other:pulsar://10.0.0.5:6650"), "", "is given to listeners 'internal' and "
                                                     "'other'"),
    (("internal:pulsar+ssl://10.0.0.5:6651",), "", "listener 'internal' has no pulsar:// URL"),
    ((INTERNAL,), "external", "internal_listener_name 'external' is not one of"),
])
def test_malformed_settings_are_one_clear_line(items: tuple[str, ...], internal: str,
                                                message: str) -> None:
    with pytest.raises(ValueError, match=r"^(advertised_listeners|internal_listener_name)",
                       ) as error:
        parse_listeners(items, internal)
    text = str(error.value)
    assert message in text
    assert "\n" not in text


def test_tls_urls_must_match_the_tls_port() -> None:
    plain = parse_listeners((INTERNAL,))
    both = parse_listeners((INTERNAL, "internal:pulsar+ssl://10.0.0.5:6651"))
    check_tls(plain, tls_running=False)
    check_tls(both, tls_running=True)
    with pytest.raises(ValueError, match=r"has no pulsar\+ssl:// URL, but the broker serves TLS"):
        check_tls(plain, tls_running=True)
    with pytest.raises(ValueError, match=r"has a pulsar\+ssl:// URL, but the broker serves no"):
        check_tls(both, tls_running=False)


def test_a_lookup_answers_the_named_listener_or_the_defaults() -> None:
    listeners = parse_listeners((INTERNAL, EXTERNAL, "external:pulsar+ssl://example.com:6651"))
    defaults = ("pulsar://self:6650", None)
    assert listeners.lookup("external", *defaults) == (
        "pulsar://broker.example.com:6650", "pulsar+ssl://example.com:6651")
    assert listeners.lookup(" external ", *defaults)[0] == "pulsar://broker.example.com:6650"
    assert listeners.lookup("", *defaults) == defaults
    assert listeners.lookup("  ", *defaults) == defaults
    with pytest.raises(ListenerNotFoundError, match=r"^the broker do not have test listener$"):
        listeners.lookup("test", *defaults)


def test_without_listeners_any_name_is_missing() -> None:
    with pytest.raises(ListenerNotFoundError) as error:
        parse_listeners(()).lookup("test", "pulsar://self:6650", None)
    assert error.value.code == 6  # ServiceNotReady, as Pulsar answers the lookup


def test_the_broker_config_checks_its_listeners() -> None:
    config = BrokerConfig(advertised_listeners=(INTERNAL, EXTERNAL),
                          internal_listener_name="external")
    assert listeners_of(config).internal_name == "external"
    with pytest.raises(ValueError, match="does not name its listener"):
        BrokerConfig(advertised_listeners=("pulsar://10.0.0.5:6650",))
