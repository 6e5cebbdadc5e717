"""`parse_message` checks required fields and UTF-8 strings in one walk of what a message holds
(instead of the runtime's `IsInitialized` and then a walk): it must refuse exactly what
`IsInitialized` refuses, at any depth, with the runtime's names for what is missing."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magnetar.codec import RemoteProtocolError, pb
from magnetar.codec._wire import parse_message


def _complete_metadata() -> pb.MessageMetadata:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2,
                                  num_messages_in_batch=3, partition_key="k")
    metadata.properties.add(key="a", value="b")
    metadata.properties.add(key="c", value="d")
    keys = metadata.encryption_keys.add(key="ek", value=b"v")
    keys.metadata.add(key="m", value="n")
    return metadata


# Every required field of the metadata above, as a way to clear it: (path, clear).
def _clear(path: str) -> Any:
    def clear(metadata: pb.MessageMetadata) -> None:
        *parents, name = path.split(".")
        target: Any = metadata
        for part in parents:
            target = target[int(part)] if part.isdigit() else getattr(target, part)
        target.ClearField(name)
    return clear


REQUIRED = ["producer_name", "sequence_id", "publish_time", "properties.0.key",
            "properties.1.value", "encryption_keys.0.key", "encryption_keys.0.value",
            "encryption_keys.0.metadata.0.value"]


def _parse(data: bytes) -> pb.MessageMetadata:
    return parse_message(pb.MessageMetadata, data, "MessageMetadata")


@pytest.mark.parametrize("path", REQUIRED)
def test_a_missing_required_field_is_refused_with_the_runtimes_name_for_it(path: str) -> None:
    metadata = _complete_metadata()
    _clear(path)(metadata)
    data = metadata.SerializePartialToString()
    expected = ", ".join(metadata.FindInitializationErrors())  # type: ignore[attr-defined]
    with pytest.raises(RemoteProtocolError, match="lacks required fields") as raised:
        _parse(data)
    assert str(raised.value).endswith(expected)


def test_a_complete_message_parses() -> None:
    metadata = _complete_metadata()
    assert _parse(metadata.SerializeToString()) == metadata


@settings(max_examples=200, deadline=None)
@given(st.sets(st.sampled_from(REQUIRED)))
def test_refuses_exactly_what_is_initialized_refuses(cleared: set[str]) -> None:
    metadata = _complete_metadata()
    for path in sorted(cleared, reverse=True):
        _clear(path)(metadata)
    data = metadata.SerializePartialToString()
    if metadata.IsInitialized():
        assert _parse(data) == metadata
    else:
        with pytest.raises(RemoteProtocolError, match="lacks required fields"):
            _parse(data)
