"""The data source's options, checked once, and the positions (offsets) it reads between.

A position is one topic-partition's offset: the id of the last message *included* so far,
`(ledger, entry, batch)`, with batch -1 meaning "the whole entry" (a non-batched message, or
every message of a batch). `EARLIEST` is before every message. A range `(start, end]` holds
the messages whose `key` is greater than `start`'s and not greater than `end`'s. Offsets travel
as JSON `{"<topic-partition>": "ledger:entry:batch", ...}` with sorted keys (Spark compares
offsets as JSON text); the same strings are the `messageId` column, so a row's id can be pasted
into `startingOffsets`.

Every error is a `MagnetarSparkError` whose message names the option.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["EARLIEST", "LATEST", "MagnetarSparkError", "Options", "Position", "ReadOptions",
           "WriteOptions", "dump_offsets", "parse_offsets", "parse_position"]

BATCH_ALL = 1 << 31  # the key of batch index -1: after every index of the entry


class MagnetarSparkError(ValueError):
    """A bad option or an unusable source; the message names the option."""


@dataclass(frozen=True, order=True)
class Position:
    """The last message included (see the module comment)."""

    ledger: int
    entry: int
    batch: int = -1

    def key(self) -> tuple[int, int, int]:
        return (self.ledger, self.entry, BATCH_ALL if self.batch < 0 else self.batch)

    def __str__(self) -> str:
        return f"{self.ledger}:{self.entry}:{self.batch}"


EARLIEST = Position(-1, -1, -1)
LATEST = "latest"  # a marker for "the last message when the query is planned"

_POSITION = re.compile(r"^(-?\d+):(-?\d+)(?::(-?\d+))?$")


def parse_position(text: object, where: str) -> Position:
    """`"L:E[:B]"`, `"earliest"` or `-2` (Kafka's earliest) as a Position.

    Raises:
        MagnetarSparkError: not one of those forms (`where` names the option and key).
    """
    if text == "earliest" or text == -2:
        return EARLIEST
    match = _POSITION.match(text) if isinstance(text, str) else None
    if match is None:
        raise MagnetarSparkError(f"{where}: {text!r} is not a message id 'ledger:entry[:batch]'"
                                 f" or 'earliest'")
    ledger, entry, batch = match.groups()
    return Position(int(ledger), int(entry), int(batch) if batch is not None else -1)


def parse_offsets(text: str, option: str) -> dict[str, Position | str]:
    """A JSON offsets option: `{"topic[-partition-N]": "L:E:B" | "earliest" | "latest"}`.

    Raises:
        MagnetarSparkError: malformed JSON, not an object, or a malformed message id.
    """
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise MagnetarSparkError(f"option {option}: malformed JSON ({exc})") from None
    if not isinstance(value, dict) or not value:
        raise MagnetarSparkError(f"option {option}: expected 'earliest', 'latest' or a JSON "
                                 f"object of message ids per topic-partition, not {text!r}")
    out: dict[str, Position | str] = {}
    for topic, position in value.items():
        out[complete(topic)] = LATEST if position in ("latest", -1) else \
            parse_position(position, f"option {option}[{topic!r}]")
    return out


def dump_offsets(offsets: Mapping[str, Position]) -> dict[str, str]:
    """The offset dict Spark stores: sorted keys, string positions."""
    return {topic: str(offsets[topic]) for topic in sorted(offsets)}


def complete(topic: str) -> str:
    """A full topic name (`t` -> `persistent://public/default/t`)."""
    from magnetar._group import complete_topic_name

    return complete_topic_name(topic.strip())


_READ_KEYS = {"service", "adminurl", "topic", "topics", "topicspattern", "startingoffsets",
              "endingoffsets", "startingtime", "endingtime", "failondataloss",
              "maxrecordspertrigger", "minpartitions", "subscription", "polltimeoutms", "path"}
_WRITE_KEYS = {"service", "adminurl", "topic", "deduplication", "producername", "path",
               "checkpointlocation", "queryname"}


@dataclass(frozen=True)
class Options:
    """What both directions share: where the broker is."""

    service: str
    admin_url: str | None

    @staticmethod
    def _common(options: Mapping[str, str], allowed: set[str]) -> tuple[dict[str, str], str]:
        lowered = {k.lower(): v for k, v in options.items()}
        unknown = sorted(set(lowered) - allowed)
        if unknown:
            raise MagnetarSparkError(f"unknown option(s) {unknown}; the magnetar source takes "
                                     f"{sorted(allowed - {'path'})}")
        service = lowered.get("service") or lowered.get("path")
        if not service:
            raise MagnetarSparkError("option service is required: a data directory, file:// "
                                     "URL, pulsar://host:port or http://host:port")
        return lowered, service


@dataclass(frozen=True)
class ReadOptions(Options):
    topics: tuple[str, ...]
    pattern: str | None
    starting: str | dict[str, Position | str]  # "earliest" | "latest" | per topic
    ending: str | dict[str, Position | str]
    starting_time_ms: int | None
    ending_time_ms: int | None
    fail_on_data_loss: bool
    max_records_per_trigger: int | None
    min_partitions: int | None
    subscription: str | None
    poll_timeout_ms: int

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool) -> ReadOptions:
        """Check a read's options (`streaming`: readStream, where `startingOffsets` defaults
        to latest and `endingOffsets` is refused).

        Raises:
            MagnetarSparkError: a missing, unknown, conflicting or malformed option.
        """
        lowered, service = cls._common(options, _READ_KEYS)
        chosen = [k for k in ("topic", "topics", "topicspattern") if lowered.get(k)]
        if len(chosen) != 1:
            raise MagnetarSparkError(
                "exactly one of the options topic, topics, topicsPattern is required"
                + (f"; got {', '.join(chosen)}" if chosen else ""))
        topics: tuple[str, ...] = ()
        pattern = None
        if chosen[0] == "topicspattern":
            pattern = complete(lowered["topicspattern"])
            try:
                re.compile(pattern)
            except re.error as exc:
                raise MagnetarSparkError(f"option topicsPattern: bad regular expression "
                                         f"({exc})") from None
        else:
            names = [t for t in lowered[chosen[0]].split(",") if t.strip()]
            if not names:
                raise MagnetarSparkError(f"option {chosen[0]}: no topic name")
            topics = tuple(complete(t) for t in names)
        starting = _offsets_option(lowered, "startingoffsets", "startingOffsets",
                                   "latest" if streaming else "earliest")
        ending = _offsets_option(lowered, "endingoffsets", "endingOffsets", "latest")
        if not streaming and starting == "latest":
            raise MagnetarSparkError("option startingOffsets: 'latest' is for streaming reads "
                                     "(a batch read from latest would be empty)")
        if ending == "earliest":
            raise MagnetarSparkError("option endingOffsets: 'earliest' is not an end")
        if streaming and "endingoffsets" in lowered:
            raise MagnetarSparkError("option endingOffsets is for batch reads only")
        return cls(
            service=service, admin_url=lowered.get("adminurl"), topics=topics, pattern=pattern,
            starting=starting, ending=ending,
            starting_time_ms=_int_option(lowered, "startingtime", "startingTime", 0),
            ending_time_ms=_int_option(lowered, "endingtime", "endingTime", 0),
            fail_on_data_loss=_bool_option(lowered, "failondataloss", "failOnDataLoss", True),
            max_records_per_trigger=_int_option(lowered, "maxrecordspertrigger",
                                                "maxRecordsPerTrigger", 1),
            min_partitions=_int_option(lowered, "minpartitions", "minPartitions", 1),
            subscription=lowered.get("subscription") or None,
            poll_timeout_ms=_int_option(lowered, "polltimeoutms", "pollTimeoutMs", 1) or 120000)


@dataclass(frozen=True)
class WriteOptions(Options):
    topic: str | None
    deduplication: bool

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        """Check a write's options.

        Raises:
            MagnetarSparkError: a missing, unknown or malformed option.
        """
        lowered, service = cls._common(options, _WRITE_KEYS)
        topic = lowered.get("topic")
        return cls(service=service, admin_url=lowered.get("adminurl"),
                   topic=complete(topic) if topic else None,
                   deduplication=_bool_option(lowered, "deduplication", "deduplication", True))


def _offsets_option(lowered: Mapping[str, str], key: str, name: str,
                    default: str) -> str | dict[str, Position | str]:
    text = lowered.get(key, default).strip()
    if text in ("earliest", "latest"):
        return text
    return parse_offsets(text, name)


def _int_option(lowered: Mapping[str, str], key: str, name: str, least: int) -> int | None:
    text = lowered.get(key)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise MagnetarSparkError(f"option {name}: {text!r} is not an integer") from None
    if value < least:
        raise MagnetarSparkError(f"option {name}: {value} is less than {least}")
    return value


def _bool_option(lowered: Mapping[str, str], key: str, name: str, default: bool) -> bool:
    text = lowered.get(key)
    if text is None:
        return default
    if text.lower() not in ("true", "false"):
        raise MagnetarSparkError(f"option {name}: {text!r} is not true or false")
    return text.lower() == "true"
