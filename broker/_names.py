"""Topic and namespace names, parsed and validated the way Pulsar 4.0 does (reference §8.1, §8.3).

Theory of operation
-------------------

A topic name has a *domain* (`persistent` or `non-persistent`, accepted in any case and printed
in lower case), a tenant, a namespace and a *local name*:

    persistent://tenant/namespace/local            the new form
    persistent://tenant/cluster/namespace/local    the legacy form (a cluster between the two)
    local                                          short: persistent://public/default/local
    tenant/namespace/local                         short: persistent://tenant/namespace/local

Parsing follows upstream's steps, because the exact steps decide the odd cases:

1. Without `://` the text is a short name. It is split on `/` dropping empty pieces; one piece
   means `public/default`, three pieces mean `tenant/namespace/local`, anything else is an error.
   The short name is then rewritten as `persistent://<text>` and parsed like a full name.
2. The text before the first `://` is the domain.
3. The rest is split on `/` into at most 4 pieces: 3 pieces are the new form, 4 the legacy form,
   where the fourth piece keeps any further `/` (`persistent://t/c/ns/a/b` has the local name
   `a/b`). So a new-form name whose local name holds a `/` reads as the legacy form.
4. Tenant, cluster and namespace must be non-empty and match `[-=:.\\w]*` (ASCII letters,
   digits, `_`, `-`, `=`, `:`, `.`); the local name must only be non-empty.

Error messages are upstream's, word for word, so an admin tool that greps them keeps working.

Partitions: partition i of topic T is `T-partition-i`. A name is a partition when the text after
its *last* `-partition-` is a canonical non-negative 32-bit integer (`x-partition-01` and
`x-partition--1` are not partitions); its base name is everything before that `-partition-`.

System topics (reference §8.3) are decided on the base name: the topic-policies and
transaction-buffer names, the pending-ack suffix and the transaction-coordinator topics under
`pulsar/system`. Names that only contain those words (`not_really__change_events`) are not.

Length limits. Names become keys of the metadata store, whose keys are at most
`METADATA_KEY_BYTES_MAX` (LMDB's limit); the longest key a topic and a subscription make is
the cursor key `cursor/<persistence name>\x00<subscription>`. The key space is split into a
fixed budget per part, so each name is checked on its own, up front, before anything is
created: subscription (and producer) names at most `SUBSCRIPTION_NAME_BYTES_MAX` bytes of
UTF-8; tenant, cluster and namespace parts at most `NAMED_ENTITY_CHARS_MAX` characters; a
topic at most `TOPIC_STORED_NAME_BYTES_MAX` bytes in the longest form the store keeps it
(`topic_stored_bytes`), counted for its partitioned base plus room for the longest partition
suffix, so every partition of a valid name is valid too. Pulsar itself has no such limits
(its metadata store takes long paths); an over-long topic name is InvalidTopicName, as upstream
answers any topic name it cannot use, and an over-long subscription or producer name is what
upstream answers for a name it refuses (a NamingException: ProducerBusy).

Regex subscriptions (reference §8.4): `topics_hash` is the CRC32C the broker puts in
CommandGetTopicsOfNamespaceResponse, and `matches_topics_pattern` the broker-side filter. The
pattern is a client's, run on the event loop against every topic of a namespace, so it runs on
RE2 (linear time, no catastrophic backtracking) rather than `re`; Java syntax RE2 does not have
(backreferences, lookaround) is an invalid pattern, as with upstream's RE2J matcher.
"""

from __future__ import annotations

import functools
import re
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import quote

import crc32c
import re2  # type: ignore[import-untyped]  # google-re2 ships no type information

from magnetar.storage import META_KEY_BYTES_MAX

from ._errors import InvalidTopicNameError, ProducerBusyError

__all__ = [
    "METADATA_KEY_BYTES_MAX",
    "NAMED_ENTITY_CHARS_MAX",
    "NON_PERSISTENT",
    "PERSISTENT",
    "PRODUCER_NAME_BYTES_MAX",
    "SUBSCRIPTION_NAME_BYTES_MAX",
    "TOPIC_STORED_NAME_BYTES_MAX",
    "NamespaceName",
    "TopicDomain",
    "TopicName",
    "advertised_url_for",
    "check_producer_name",
    "check_subscription_name",
    "matches_topics_pattern",
    "strip_domain_scheme",
    "topic_stored_bytes",
    "topics_hash",
]

TopicDomain = Literal["persistent", "non-persistent"]
PERSISTENT: Final = "persistent"
NON_PERSISTENT: Final = "non-persistent"
_DOMAINS: Final[tuple[TopicDomain, ...]] = ("persistent", "non-persistent")

PUBLIC_TENANT: Final = "public"
DEFAULT_NAMESPACE: Final = "default"
PARTITION_SUFFIX: Final = "-partition-"
_INT32_MAX: Final = (1 << 31) - 1

# Java's `\w` is ASCII-only; Python's is Unicode unless told otherwise.
_NAMED_ENTITY: Final = re.compile(r"[-=:.\w]*", re.ASCII)
_CANONICAL_INDEX: Final = re.compile(r"0|[1-9][0-9]*")

# -- length limits (see the module comment) --
METADATA_KEY_BYTES_MAX: Final = META_KEY_BYTES_MAX  # the metadata store's (LMDB's) key limit
SUBSCRIPTION_NAME_BYTES_MAX: Final = 128  # UTF-8 bytes; also the cursor's name
PRODUCER_NAME_BYTES_MAX: Final = SUBSCRIPTION_NAME_BYTES_MAX  # UTF-8 bytes (no key, same bound)
NAMED_ENTITY_CHARS_MAX: Final = 64  # a tenant, cluster or namespace part (ASCII only)
_CURSOR_KEY_OVERHEAD_BYTES: Final = len(b"cursor/") + len(b"\x00")  # _ml_records.cursor_key
# The longest other key prefix a topic name goes under (topic policies, partitions, schemas,
# managed ledgers); the topic's budget must fit each of them too.
_TOPIC_KEY_PREFIX_BYTES_MAX: Final = max(len(b"topicpolicy/"), len(b"partitioned/"),
                                         len(b"schema/"), len(b"ml/"))
TOPIC_STORED_NAME_BYTES_MAX: Final = (METADATA_KEY_BYTES_MAX - _CURSOR_KEY_OVERHEAD_BYTES
                                      - SUBSCRIPTION_NAME_BYTES_MAX)
# Room kept for "-partition-<index>" after a base name: the longest index is int32 max.
_PARTITION_SUFFIX_BYTES_MAX: Final = len(PARTITION_SUFFIX) + len(str(_INT32_MAX))
assert (_CURSOR_KEY_OVERHEAD_BYTES + TOPIC_STORED_NAME_BYTES_MAX + SUBSCRIPTION_NAME_BYTES_MAX
        == METADATA_KEY_BYTES_MAX), "a topic's and a subscription's budgets fill a cursor key"
assert _TOPIC_KEY_PREFIX_BYTES_MAX + TOPIC_STORED_NAME_BYTES_MAX <= METADATA_KEY_BYTES_MAX
# The longest namespace leaves room for a topic name of a useful length.
assert 3 * (NAMED_ENTITY_CHARS_MAX + 1) + len("non-persistent://") \
    + _PARTITION_SUFFIX_BYTES_MAX + 64 <= TOPIC_STORED_NAME_BYTES_MAX
_SHOWN_NAME_CHARS_MAX: Final = 80  # an over-long name is quoted this far in errors and logs

# Parsed names are immutable, so parses are shared; bounded, as an entry and its key hold
# ~0.2 KB (20 MB at upstream's 100000 names) and the busy names fit in far fewer.
_PARSE_CACHE_ENTRIES_MAX: Final = 8192

# Base-name local names that are system topics (SystemTopicNames.EVENTS_TOPIC_NAMES).
_EVENTS_LOCAL_NAMES: Final = frozenset({
    "__change_events",
    "__transaction_buffer_snapshot",
    "__transaction_buffer_snapshot_segments",
    "__transaction_buffer_snapshot_indexes",
})
_PENDING_ACK_SUFFIX: Final = "__transaction_pending_ack"
_TRANSACTION_PREFIXES: Final = (
    "persistent://pulsar/system/transaction_coordinator_assign",
    "persistent://pulsar/system/__transaction_log_",
)


def _shown(name: str) -> str:
    """`name` as errors and logs quote it: cut after `_SHOWN_NAME_CHARS_MAX` characters."""
    if len(name) <= _SHOWN_NAME_CHARS_MAX:
        return name
    return f"{name[:_SHOWN_NAME_CHARS_MAX]}... ({len(name)} characters)"


def _check_named_entity(name: str) -> None:
    """Raise unless `name` uses only the characters tenants, clusters and namespaces may use,
    and at most `NAMED_ENTITY_CHARS_MAX` of them."""
    if len(name) > NAMED_ENTITY_CHARS_MAX:
        raise InvalidTopicNameError(f"Invalid named entity: {_shown(name)}: longer than "
                                    f"{NAMED_ENTITY_CHARS_MAX} characters")
    if _NAMED_ENTITY.fullmatch(name) is None:
        raise InvalidTopicNameError(f"Invalid named entity: {name}")


def check_tenant_name(name: str) -> None:
    """Validate a tenant name (characters and length) as a namespace part.

    Raises:
        InvalidTopicNameError: it is empty, too long or holds a character outside
            `[-=:.A-Za-z0-9_]`; nothing was done.
    """
    if name == "":
        raise InvalidTopicNameError("Invalid named entity: an empty tenant name")
    _check_named_entity(name)


def _check_client_name(kind: str, name: str, limit_bytes: int) -> None:
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > limit_bytes:
        raise ProducerBusyError(f"{kind} name {_shown(name)!r} is too long: {size} bytes, "
                                f"at most {limit_bytes} bytes (UTF-8)")


def check_subscription_name(name: str) -> None:
    """Refuse a subscription name longer than `SUBSCRIPTION_NAME_BYTES_MAX` bytes of UTF-8,
    before anything is created.

    Raises:
        ProducerBusyError: the name is too long (upstream answers a subscription name it
            refuses with a NamingException, which goes out as ProducerBusy).
    """
    _check_client_name("Subscription", name, SUBSCRIPTION_NAME_BYTES_MAX)


def check_producer_name(name: str) -> None:
    """Refuse a producer name longer than `PRODUCER_NAME_BYTES_MAX` bytes of UTF-8.

    Raises:
        ProducerBusyError: the name is too long (upstream's code for a refused name).
    """
    _check_client_name("Producer", name, PRODUCER_NAME_BYTES_MAX)


def _validate_namespace_parts(*parts: str) -> None:
    """Upstream's NamespaceName.validateNamespaceName for 2 (new) or 3 (legacy) parts."""
    assert len(parts) in (2, 3)
    if any(part == "" for part in parts):
        raise InvalidTopicNameError("Invalid namespace format. namespace: " + "/".join(parts))
    for part in parts:
        _check_named_entity(part)


def _url_encode(text: str) -> str:
    """Java's URLEncoder.encode(text, UTF-8): keep [A-Za-z0-9.*_-], space to '+', else %XX."""
    out: list[str] = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        if char.isascii() and (char.isalnum() or char in ".-*_"):
            out.append(char)
        elif char == " ":
            out.append("+")
        else:
            out.append(f"%{byte:02X}")
    return "".join(out)


def _partition_index(local_name: str) -> int:
    """The partition index a local name ends with, or -1 when it names no partition.

    Upstream searches the complete name, but the text after a `-partition-` found in the tenant
    or namespace holds a `/`, so only the local name can yield an index. A local name that
    *starts* with `-partition-<n>` would leave an empty base name; it is not a partition here
    (upstream would call it one and then build an invalid base name)."""
    cut = local_name.rfind(PARTITION_SUFFIX)
    if cut <= 0:
        return -1
    text = local_name[cut + len(PARTITION_SUFFIX):]
    if _CANONICAL_INDEX.fullmatch(text) is None:
        return -1
    index = int(text)
    return index if index <= _INT32_MAX else -1


@dataclass(frozen=True, slots=True)
class NamespaceName:
    """A namespace: `tenant/namespace`, or the legacy `tenant/cluster/namespace`.

    Attributes:
        tenant: the tenant.
        namespace: the namespace portion (the last part).
        cluster: the cluster of a legacy name, else None.
    """

    tenant: str
    namespace: str
    cluster: str | None = None

    @staticmethod
    def parse(text: str) -> NamespaceName:
        """Parse and validate a namespace name.

        Args:
            text: `tenant/namespace` or `tenant/cluster/namespace`.

        Returns:
            The namespace name.

        Raises:
            InvalidTopicNameError: the text is empty, has another number of parts, or a part is
                empty or holds a character outside `[-=:.A-Za-z0-9_]`. The message is upstream's.
        """
        if text == "":
            raise InvalidTopicNameError(f"Invalid null namespace: {text}")
        parts = text.split("/")
        try:
            if len(parts) not in (2, 3):
                raise InvalidTopicNameError(f"Invalid namespace format. namespace: {text}")
            _validate_namespace_parts(*parts)
        except InvalidTopicNameError as error:
            raise InvalidTopicNameError(
                "Invalid namespace format. expected <tenant>/<namespace> or "
                f"<tenant>/<cluster>/<namespace> but got: {_shown(text)}") from error
        if len(parts) == 2:
            return NamespaceName(parts[0], parts[1])
        return NamespaceName(parts[0], parts[2], cluster=parts[1])

    @property
    def is_v2(self) -> bool:
        """True for the new form (no cluster)."""
        return self.cluster is None

    def __str__(self) -> str:
        if self.cluster is None:
            return f"{self.tenant}/{self.namespace}"
        return f"{self.tenant}/{self.cluster}/{self.namespace}"


@dataclass(frozen=True, slots=True)
class TopicName:
    """A parsed, validated topic name. Build one with `TopicName.parse`.

    Attributes:
        domain: "persistent" or "non-persistent".
        tenant: the tenant.
        namespace: the namespace portion (without the tenant).
        local_name: the topic's own name, partition suffix included.
        cluster: the cluster of a legacy 4-part name, else None.
    """

    domain: TopicDomain
    tenant: str
    namespace: str
    local_name: str
    cluster: str | None = None

    def __post_init__(self) -> None:
        """Raises InvalidTopicNameError when the name is too long to store (see the module
        comment); the name's syntax is `parse`'s business."""
        assert self.domain in _DOMAINS
        assert self.local_name != ""
        if _stored_bytes_bound(self) <= TOPIC_STORED_NAME_BYTES_MAX:
            return  # the common case, without encoding the name
        size = topic_stored_bytes(self)
        if size > TOPIC_STORED_NAME_BYTES_MAX:
            raise InvalidTopicNameError(
                f"Invalid topic name: {_shown(str(self))}: too long, {size} bytes as stored "
                f"(with room for a partition suffix), at most {TOPIC_STORED_NAME_BYTES_MAX}")

    @staticmethod
    def parse(text: str) -> TopicName:
        """Parse and validate a topic name in any of its forms (see the module comment).

        Args:
            text: a full, legacy or short topic name.

        Returns:
            The topic name; `str()` of it is the complete name.

        Raises:
            InvalidTopicNameError: the name is malformed; the message is upstream's.
        """
        return _parse_cached(text)

    @property
    def is_persistent(self) -> bool:
        """True for the persistent domain."""
        return self.domain == PERSISTENT

    @property
    def is_v2(self) -> bool:
        """True for the new form (no cluster)."""
        return self.cluster is None

    @property
    def namespace_name(self) -> str:
        """The namespace as text: "tenant/namespace" (legacy: "tenant/cluster/namespace")."""
        if self.cluster is None:
            return f"{self.tenant}/{self.namespace}"
        return f"{self.tenant}/{self.cluster}/{self.namespace}"

    @property
    def partition_index(self) -> int:
        """The partition index, or -1 when this is not a partition of a partitioned topic."""
        return _partition_index(self.local_name)

    @property
    def is_partitioned(self) -> bool:
        """True when this name is one partition of a partitioned topic."""
        return self.partition_index != -1

    @property
    def partitioned_base(self) -> TopicName:
        """The partitioned topic this partition belongs to (itself when not a partition)."""
        if not self.is_partitioned:
            return self
        cut = self.local_name.rfind(PARTITION_SUFFIX)
        assert cut > 0
        return TopicName(self.domain, self.tenant, self.namespace, self.local_name[:cut],
                         self.cluster)

    def partition(self, index: int) -> TopicName:
        """The name of partition `index` of this topic.

        Like upstream, -1, or a name already ending in `-partition-<index>`, gives this name
        back; any other name gets the suffix appended (`t-partition-0-DLQ` → partition 0 is
        `t-partition-0-DLQ-partition-0`).

        Args:
            index: the partition index, >= 0 (or -1).

        Returns:
            The partition's topic name.
        """
        assert index >= -1
        suffix = f"{PARTITION_SUFFIX}{index}"
        if index == -1 or self.local_name.endswith(suffix):
            return self
        return TopicName(self.domain, self.tenant, self.namespace, self.local_name + suffix,
                         self.cluster)

    @property
    def encoded_local_name(self) -> str:
        """The local name URL-encoded exactly as Java's URLEncoder does it."""
        return _url_encode(self.local_name)

    @property
    def persistence_name(self) -> str:
        """The storage key of the topic: `tenant/namespace/domain/<encoded local name>`
        (legacy: `tenant/cluster/namespace/domain/<encoded local name>`), as upstream's
        managed-ledger name. The encoding removes every `/` from the local name, so the key
        has a fixed number of `/`-separated parts."""
        if self.cluster is None:
            return f"{self.tenant}/{self.namespace}/{self.domain}/{self.encoded_local_name}"
        return (f"{self.tenant}/{self.cluster}/{self.namespace}/{self.domain}/"
                f"{self.encoded_local_name}")

    @property
    def is_system_topic(self) -> bool:
        """True for Pulsar's internal topics (reference §8.3), decided on the base name:
        `__change_events` and the `__transaction_buffer_snapshot*` names, names ending in
        `__transaction_pending_ack`, and the transaction-coordinator topics of
        `pulsar/system`. System topics are hidden from namespace listings and never
        deduplicate."""
        base = self.partitioned_base
        if base.local_name in _EVENTS_LOCAL_NAMES:
            return True
        full = str(base)
        return full.endswith(_PENDING_ACK_SUFFIX) or full.startswith(_TRANSACTION_PREFIXES)

    def __str__(self) -> str:
        return f"{self.domain}://{self.namespace_name}/{self.local_name}"


def _base_parts(name: TopicName) -> tuple[str, str]:
    """(namespace name, base local name) of a topic."""
    local = name.local_name
    if name.is_partitioned:
        local = local[:local.rfind(PARTITION_SUFFIX)]
    return name.namespace_name, local


def _stored_bytes_bound(name: TopicName) -> int:
    """A cheap upper bound of `topic_stored_bytes` (every byte encoded as %XX)."""
    namespace, local = _base_parts(name)
    return (len(name.domain) + len("://") + 3 * len(namespace) + len("/")
            + 3 * len(local.encode("utf-8", "surrogatepass")) + _PARTITION_SUFFIX_BYTES_MAX)


def topic_stored_bytes(name: TopicName) -> int:
    """The bytes a topic takes in the longest form the metadata store keeps it in, counted for
    its partitioned base plus room for the longest `-partition-<index>`: the most of
    `persistence_name` (managed-ledger and cursor keys), the full name as UTF-8 (policy and
    partition keys) and the full name percent-encoded keeping `:` and `/` (schema keys)."""
    namespace, local = _base_parts(name)
    full = f"{name.domain}://{namespace}/{local}"
    longest = max(len(namespace) + len(name.domain) + 2 + len(_url_encode(local)),
                  len(full.encode("utf-8", "surrogatepass")),
                  len(quote(full, safe=":/", errors="surrogatepass")))
    return longest + _PARTITION_SUFFIX_BYTES_MAX


@functools.lru_cache(maxsize=_PARSE_CACHE_ENTRIES_MAX)
def _parse_cached(text: str) -> TopicName:
    """TopicName.parse without the cache (lru_cache never caches a raised error)."""
    full = _expand_short_name(text) if "://" not in text else text
    scheme, _, rest = full.partition("://")
    domain = _parse_domain(scheme)
    parts = rest.split("/", 3)
    if len(parts) == 3:
        tenant, namespace, local = parts
        cluster = None
        _validate_namespace_parts(tenant, namespace)
    elif len(parts) == 4:
        tenant, cluster, namespace, local = parts
        _validate_namespace_parts(tenant, cluster, namespace)
    else:
        raise InvalidTopicNameError(f"Invalid topic name: {full}")
    if local == "":
        raise InvalidTopicNameError(f"Invalid topic name: {full}")
    # interned: many topics' tenant and namespace are one string each, not one per name
    return TopicName(domain, sys.intern(tenant), sys.intern(namespace), local, cluster)


def _expand_short_name(text: str) -> str:
    """The full form of a short name (`local` or `tenant/namespace/local`)."""
    pieces = [piece for piece in text.split("/") if piece]
    if len(pieces) == 1:
        return f"{PERSISTENT}://{PUBLIC_TENANT}/{DEFAULT_NAMESPACE}/{pieces[0]}"
    if len(pieces) == 3:
        return f"{PERSISTENT}://{text}"
    raise InvalidTopicNameError(
        f"Invalid short topic name '{text}', it should be in the format of "
        "<tenant>/<namespace>/<topic> or <topic>")


def _parse_domain(text: str) -> TopicDomain:
    """The domain named by `text`, in any case."""
    lowered = text.lower()
    for domain in _DOMAINS:
        if lowered == domain:
            return domain
    raise InvalidTopicNameError(f"Invalid topic domain: '{text}'")


def _java_string_order(name: str) -> bytes:
    """Sort key that orders strings the way Java's String.compareTo does (by UTF-16 code
    units), which differs from Python's code-point order above U+FFFF."""
    return name.encode("utf-16-be", "surrogatepass")


def topics_hash(names: Iterable[str], presorted: bool = False) -> str:
    """The `topics_hash` of a topic list, as CommandGetTopicsOfNamespaceResponse carries it.

    CRC32C over the names sorted as Java sorts them and joined by ',', printed the way Guava
    prints a 32-bit hash code: the 4 bytes in little-endian order as lowercase hex. An empty
    list hashes to "00000000". The client compares it with its own to skip unchanged lists.

    Args:
        names: complete topic names (any order; with `presorted`, in Java's order already).

    Returns:
        8 lowercase hex digits.
    """
    ordered = names if presorted else sorted(names, key=_java_string_order)
    value = crc32c.crc32c(",".join(ordered).encode("utf-8"))
    text = int(value).to_bytes(4, "little").hex()
    assert len(text) == 8
    return text


def strip_domain_scheme(pattern: str) -> str:
    """Remove the `persistent://` / `non-persistent://` scheme from a topics pattern, keeping
    anything before the domain word (such as a leading `^`)."""
    if "://" not in pattern:
        return pattern
    prefix, _, rest = pattern.partition("://")
    # "non-persistent" ends with "persistent", so test the longer word first.
    for domain in (NON_PERSISTENT, PERSISTENT):
        if prefix.endswith(domain):
            return prefix[:-len(domain)] + rest
    raise ValueError(f"Does not support topic domain: {prefix}")


# Compiled topics patterns, shared by the requests and watchers that use the same pattern.
_PATTERN_CACHE_ENTRIES_MAX: Final = 1024


@functools.lru_cache(maxsize=_PATTERN_CACHE_ENTRIES_MAX)
def _compiled_topics_pattern(regex: str) -> re2._Regexp:
    options = re2.Options()
    options.log_errors = False  # a client's bad pattern is its error, not ours to log
    try:
        return re2.compile(regex, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        raise re.error(str(reason)) from None


def matches_topics_pattern(pattern: str, topic: str | TopicName) -> bool:
    """Whether a regex subscription's pattern selects a topic (the broker-side filter of
    CommandGetTopicsOfNamespace, reference §8.4).

    The pattern's domain scheme is removed, and the rest must match the whole of
    `tenant/namespace/local` of the topic's *base* name, so every partition of a matching
    partitioned topic matches.

    Args:
        pattern: the client's topics pattern, e.g. `persistent://public/default/orders-.*`.
        topic: a topic name (text or parsed).

    Returns:
        True when the pattern selects the topic.

    Raises:
        ValueError: the pattern's scheme names no topic domain.
        re.error: the pattern is not a regular expression RE2 accepts.
        InvalidTopicNameError: `topic` is text that is not a valid topic name.
    """
    name = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
    base = str(name.partitioned_base)
    _, _, without_scheme = base.partition("://")
    return _compiled_topics_pattern(strip_domain_scheme(pattern)).fullmatch(
        without_scheme) is not None


# Bind addresses that mean every interface: LOOKUP answers the machine's name for them.
_WILDCARD_HOSTS: Final = frozenset({"", "0.0.0.0", "::"})


def advertised_url_for(host: str, port: int, scheme: str = "pulsar") -> str:
    """The default URL LOOKUP answers with: `pulsar://host:port` (`pulsar+ssl://` for TLS),
    the machine's name for a wildcard bind address."""
    assert 0 < port < 65536
    assert scheme in ("pulsar", "pulsar+ssl")
    shown = socket.getfqdn() if host in _WILDCARD_HOSTS else host
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"  # an IPv6 literal
    return f"{scheme}://{shown}:{port}"
