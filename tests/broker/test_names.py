"""Topic and namespace names: upstream's TopicNameTest and SystemTopicNamesTest examples, the
invalid names of reference §8.1 with upstream's messages, and the §8.4 topic-list helpers."""

from __future__ import annotations

import re

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.broker._errors import InvalidTopicNameError, ProducerBusyError
from magnetar.broker._names import (
    METADATA_KEY_BYTES_MAX,
    NAMED_ENTITY_CHARS_MAX,
    PRODUCER_NAME_BYTES_MAX,
    SUBSCRIPTION_NAME_BYTES_MAX,
    TOPIC_STORED_NAME_BYTES_MAX,
    NamespaceName,
    TopicName,
    check_producer_name,
    check_subscription_name,
    check_tenant_name,
    matches_topics_pattern,
    topic_stored_bytes,
    topics_hash,
)

SHORT_FORMAT = "it should be in the format of <tenant>/<namespace>/<topic> or <topic>"


def test_full_new_form() -> None:
    name = TopicName.parse("persistent://tenant/namespace/topic")
    assert name.domain == "persistent"
    assert name.tenant == "tenant"
    assert name.namespace == "namespace"
    assert name.local_name == "topic"
    assert name.cluster is None
    assert name.is_v2
    assert name.is_persistent
    assert name.namespace_name == "tenant/namespace"
    assert str(name) == "persistent://tenant/namespace/topic"
    assert name.encoded_local_name == "topic"
    assert str(name.partitioned_base) == "persistent://tenant/namespace/topic"
    assert name.persistence_name == "tenant/namespace/persistent/topic"


def test_legacy_form_with_cluster() -> None:
    name = TopicName.parse("persistent://tenant/cluster/namespace/topic")
    assert (name.tenant, name.cluster, name.namespace, name.local_name) == (
        "tenant", "cluster", "namespace", "topic")
    assert not name.is_v2
    assert name.namespace_name == "tenant/cluster/namespace"
    assert str(name) == "persistent://tenant/cluster/namespace/topic"
    assert name.persistence_name == "tenant/cluster/namespace/persistent/topic"


def test_new_form_with_slash_in_local_name_reads_as_legacy() -> None:
    name = TopicName.parse("persistent://t/c/ns/a/b")
    assert (name.tenant, name.cluster, name.namespace, name.local_name) == ("t", "c", "ns", "a/b")


@pytest.mark.parametrize(("text", "local"), [
    ("persistent://tenant/cluster/namespace/ns-abc/table/1", "ns-abc/table/1"),
    ("persistent://tenant/cluster/namespace/ns-abc/table/1/", "ns-abc/table/1/"),
    ("persistent://tenant/cluster/namespace//ns-abc//table//1//", "/ns-abc//table//1//"),
    ("persistent://tenant/cluster/namespace/$#3rpa/table/1", "$#3rpa/table/1"),
])
def test_legacy_local_names_keep_every_slash(text: str, local: str) -> None:
    name = TopicName.parse(text)
    assert name.local_name == local
    assert "/" not in name.encoded_local_name
    assert str(name) == text


def test_short_forms_expand() -> None:
    short = TopicName.parse("short-topic")
    assert str(short) == "persistent://public/default/short-topic"
    three = TopicName.parse("test-tenant/test-namespace/test-short-topic")
    assert str(three) == "persistent://test-tenant/test-namespace/test-short-topic"
    # Empty pieces do not count when the short form is recognised.
    assert str(TopicName.parse("/x/")) == "persistent://public/default/x"


def test_domain_is_case_insensitive_and_printed_lower_case() -> None:
    name = TopicName.parse("Non-Persistent://t/ns/x")
    assert name.domain == "non-persistent"
    assert not name.is_persistent
    assert str(name) == "non-persistent://t/ns/x"
    assert name.persistence_name == "t/ns/non-persistent/x"
    assert TopicName.parse("PERSISTENT://t/ns/x") == TopicName.parse("persistent://t/ns/x")


@pytest.mark.parametrize(("text", "message"), [
    ("://tenant.namespace:topic", "Invalid topic domain: ''"),
    ("://tenant.namespace:my-topic", "Invalid topic domain: ''"),
    ("://tenant.namespace", "Invalid topic domain: ''"),
    ("://pulsar/cluster/namespace/", "Invalid topic domain: ''"),
    ("://tenant/cluster/namespace", "Invalid topic domain: ''"),
    ("invalid://tenant/cluster/namespace/topic", "Invalid topic domain: 'invalid'"),
    ("tenant/cluster/namespace/topic",
     f"Invalid short topic name 'tenant/cluster/namespace/topic', {SHORT_FORMAT}"),
    ("pulsar/cluster", f"Invalid short topic name 'pulsar/cluster', {SHORT_FORMAT}"),
    ("", f"Invalid short topic name '', {SHORT_FORMAT}"),
    ("persistent:///cluster/namespace/mydest-1",
     "Invalid namespace format. namespace: /cluster/namespace"),
    ("persistent://pulsar//namespace/mydest-1",
     "Invalid namespace format. namespace: pulsar//namespace"),
    ("persistent://pulsar/cluster//mydest-1",
     "Invalid namespace format. namespace: pulsar/cluster/"),
    ("persistent://pulsar/cluster/namespace/",
     "Invalid topic name: persistent://pulsar/cluster/namespace/"),
    ("persistent://tenant/namespace/", "Invalid topic name: persistent://tenant/namespace/"),
    ("persistent://tenant/ns", "Invalid topic name: persistent://tenant/ns"),
    ("persistent://a", "Invalid topic name: persistent://a"),
    ("persistent://t/n s/x", "Invalid named entity: n s"),
    ("persistent://t\u00e9/ns/x", "Invalid named entity: t\u00e9"),
    ("persistent://t/c!/ns/x", "Invalid named entity: c!"),
    # A 3-piece short name with an empty piece becomes a legacy name with an empty part.
    ("a//b/c", "Invalid namespace format. namespace: a//b"),
])
def test_invalid_names_raise_upstream_messages(text: str, message: str) -> None:
    with pytest.raises(InvalidTopicNameError) as info:
        TopicName.parse(text)
    assert str(info.value) == message
    assert info.value.code == 17


def test_named_entity_characters_allowed() -> None:
    name = TopicName.parse("persistent://a-b=c:d.e_F9/ns.1/x")
    assert name.tenant == "a-b=c:d.e_F9"


def test_local_name_has_no_character_check() -> None:
    assert TopicName.parse("persistent://t/ns/a b?c#d").local_name == "a b?c#d"
    assert TopicName.parse(" ").local_name == " "


def test_parse_is_cached_and_errors_are_not() -> None:
    assert TopicName.parse("cached-topic") is TopicName.parse("cached-topic")
    for _ in range(2):
        with pytest.raises(InvalidTopicNameError):
            TopicName.parse("a/b")


# -- partitions -------------------------------------------------------------------------------


def test_partition_names() -> None:
    topic = TopicName.parse("persistent://myprop/mycolo/myns/mytopic")
    assert str(topic.partition(0)) == "persistent://myprop/mycolo/myns/mytopic-partition-0"
    assert topic.partition(2).partition_index == 2
    assert topic.partition_index == -1
    assert topic.partition(-1) is topic
    assert topic.partition(2).partitioned_base == topic
    fourth = TopicName.parse("persistent://myprop/mycolo/myns/mytopic-partition-4")
    assert fourth.partition_index == 4


def test_partition_of_a_name_containing_the_suffix() -> None:
    dlq = TopicName.parse("tenant1/namespace1/tp1-partition-0-DLQ")
    assert not dlq.is_partitioned
    assert str(dlq.partition(0)) == (
        "persistent://tenant1/namespace1/tp1-partition-0-DLQ-partition-0")
    already = TopicName.parse("t/ns/x-partition-3")
    assert already.partition(3) is already


@pytest.mark.parametrize("local", [
    "mytopic-partition--1", "mytopic-partition--2", "mytopic-partition-00",
    "mytopic-partition-01", "mytopic-partition-012", "mytopic-partition- 12",
    "mytopic-partition-12 ", "mytopic-partition- 12 ", "mytopic-partition-1&",
    "mytopic-partition-1!", "mytopic-partition-+1", "mytopic-partition-",
    "mytopic-partition-2147483648", "-partition-1",
])
def test_not_a_partition(local: str) -> None:
    name = TopicName.parse(local)
    assert name.partition_index == -1
    assert not name.is_partitioned
    assert name.partitioned_base is name


@pytest.mark.parametrize(("local", "index", "base"), [
    ("mytopic-partition-0", 0, "mytopic"),
    ("mytopic-partition-1", 1, "mytopic"),
    ("mytopic-partition-12", 12, "mytopic"),
    ("a-partition-1-partition-2", 2, "a-partition-1"),
    ("mytopic-partition-2147483647", 2147483647, "mytopic"),
])
def test_partition_index_after_the_last_suffix(local: str, index: int, base: str) -> None:
    name = TopicName.parse(local)
    assert name.partition_index == index
    assert name.is_partitioned
    assert name.partitioned_base == TopicName.parse(base)


# -- encodings --------------------------------------------------------------------------------


def test_url_encoded_local_name_matches_java() -> None:
    raw = "a:en-in_in_business_content_item_20150312173022_https\\://in.news.example.com/r"
    encoded = ("a%3Aen-in_in_business_content_item_20150312173022_https%5C%3A%2F%2F"
               "in.news.example.com%2Fr")
    name = TopicName.parse("persistent://prop/colo/ns/" + raw)
    assert name.local_name == raw
    assert name.encoded_local_name == encoded
    assert name.persistence_name == "prop/colo/ns/persistent/" + encoded


@pytest.mark.parametrize(("local", "encoded"), [
    ("a:b:c", "a%3Ab%3Ac"),
    ("a b", "a+b"),
    ("x*y~z", "x*y%7Ez"),
    ("caf\u00e9", "caf%C3%A9"),
    ("A.z-0_9", "A.z-0_9"),
])
def test_persistence_name_encoding(local: str, encoded: str) -> None:
    name = TopicName.parse(f"persistent://tenant/namespace/{local}")
    assert name.persistence_name == f"tenant/namespace/persistent/{encoded}"


# -- system topics ----------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("persistent://public/default/__change_events", True),
    ("persistent://public/default/__change_events-partition-0", True),
    ("persistent://random-tenant/random-ns/__change_events", True),
    ("persistent://random-tenant/random-ns/__change_events-partition-1", True),
    ("persistent://public/default/not_really__change_events", False),
    ("persistent://public/default/__change_events-diff-suffix", False),
    ("persistent://a/b/not_really__change_events", False),
    ("persistent://t/ns/__transaction_buffer_snapshot", True),
    ("persistent://t/ns/__transaction_buffer_snapshot_segments", True),
    ("persistent://t/ns/__transaction_buffer_snapshot_indexes-partition-2", True),
    ("persistent://t/ns/__transaction_buffer_snapshot_other", False),
    ("persistent://t/ns/orders-my-sub__transaction_pending_ack", True),
    ("persistent://t/ns/orders-my-sub__transaction_pending_ack-partition-0", True),
    ("persistent://t/ns/__transaction_pending_ack_not", False),
    ("persistent://pulsar/system/transaction_coordinator_assign", True),
    ("persistent://pulsar/system/transaction_coordinator_assign-partition-7", True),
    ("persistent://pulsar/system/__transaction_log_3", True),
    ("persistent://other/system/transaction_coordinator_assign", False),
    ("persistent://pulsar/system/orders", False),
    ("persistent://public/default/orders", False),
])
def test_system_topics(text: str, expected: bool) -> None:
    assert TopicName.parse(text).is_system_topic is expected


# -- namespaces -------------------------------------------------------------------------------


def test_namespace_names() -> None:
    new = NamespaceName.parse("my-tenant/my-ns")
    assert (new.tenant, new.namespace, new.cluster) == ("my-tenant", "my-ns", None)
    assert new.is_v2
    assert str(new) == "my-tenant/my-ns"
    legacy = NamespaceName.parse("t/c/ns")
    assert (legacy.tenant, legacy.cluster, legacy.namespace) == ("t", "c", "ns")
    assert str(legacy) == "t/c/ns"
    assert str(TopicName.parse("t/ns/x").namespace_name) == str(NamespaceName.parse("t/ns"))


@pytest.mark.parametrize("text", [
    "tenant", "a/b/c/d", "a//b", "/a/b", "a/b/", "a/", "t/n s", "t\u00e9/ns", "t/ns!",
])
def test_invalid_namespace_names(text: str) -> None:
    with pytest.raises(InvalidTopicNameError) as info:
        NamespaceName.parse(text)
    assert str(info.value) == (
        "Invalid namespace format. expected <tenant>/<namespace> or "
        f"<tenant>/<cluster>/<namespace> but got: {text}")


def test_empty_namespace_name() -> None:
    with pytest.raises(InvalidTopicNameError, match=r"^Invalid null namespace: $"):
        NamespaceName.parse("")


# -- topic lists and patterns (reference §8.4) ------------------------------------------------


def test_topics_hash_is_guava_little_endian_crc32c() -> None:
    # CRC32C("123456789") is the standard check value 0xE3069283; Guava prints the bytes of
    # the int in little-endian order.
    assert topics_hash(["123456789"]) == "839206e3"
    assert topics_hash([]) == "00000000"


def test_topics_hash_sorts_and_joins_with_commas() -> None:
    names = ["persistent://my-property/my-ns/pattern-topic-3",
             "persistent://my-property/my-ns/pattern-topic-1",
             "persistent://my-property/my-ns/pattern-topic-2"]
    joined = ",".join(sorted(names)).encode()
    expected = crc32c.crc32c(joined).to_bytes(4, "little").hex()
    assert topics_hash(names) == expected
    assert topics_hash(reversed(names)) == expected
    assert topics_hash(names[:2]) != expected


def test_topics_hash_orders_like_java_strings() -> None:
    # Java compares UTF-16 code units: U+10000 (D800 DC00) sorts before U+FFFF.
    high, low = "t/ns/\uffff", "t/ns/\U00010000"
    java_order = f"{low},{high}".encode()
    assert topics_hash([high, low]) == crc32c.crc32c(java_order).to_bytes(4, "little").hex()


@pytest.mark.parametrize(("pattern", "topic", "expected"), [
    ("persistent://public/default/orders-.*", "persistent://public/default/orders-eu", True),
    ("persistent://public/default/orders-.*",
     "persistent://public/default/orders-eu-partition-3", True),
    ("persistent://public/default/orders-.*", "persistent://public/default/payments", False),
    # Full match: a prefix match is not enough.
    ("persistent://public/default/orders", "persistent://public/default/orders-eu", False),
    ("public/default/orders-.*", "persistent://public/default/orders-eu", True),
    ("non-persistent://public/default/.*", "persistent://public/default/x", True),
    ("^persistent://public/default/o.*", "persistent://public/default/orders", True),
    ("persistent://public/default/t\\d", "public/default/t1", True),
    ("persistent://public/default/t\\d", "public/default/t1-partition-0", True),
    ("persistent://public/default/t\\d-partition-0", "public/default/t1-partition-0", False),
    ("persistent://public/.*", "persistent://other/default/x", False),
])
def test_matches_topics_pattern(pattern: str, topic: str, expected: bool) -> None:
    assert matches_topics_pattern(pattern, topic) is expected
    assert matches_topics_pattern(pattern, TopicName.parse(topic)) is expected


def test_pattern_with_unknown_domain_is_refused() -> None:
    with pytest.raises(ValueError, match="Does not support topic domain: http"):
        matches_topics_pattern("http://public/default/.*", "public/default/x")
    with pytest.raises(re.error):
        matches_topics_pattern("persistent://public/default/(", "public/default/x")


# -- properties -------------------------------------------------------------------------------

_ENTITY = st.text(alphabet="abcXYZ019_-=:.", min_size=1, max_size=8)
_LOCAL = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=12).filter(
    lambda s: "/" not in s)


@given(domain=st.sampled_from(["persistent", "non-persistent"]), tenant=_ENTITY,
       namespace=_ENTITY, local=_LOCAL)
def test_round_trip_of_valid_names(domain: str, tenant: str, namespace: str, local: str) -> None:
    text = f"{domain}://{tenant}/{namespace}/{local}"
    name = TopicName.parse(text)
    assert str(name) == text
    assert TopicName.parse(str(name)) == name
    assert name.persistence_name.count("/") == 3


@given(tenant=_ENTITY, local=_LOCAL, index=st.integers(min_value=0, max_value=(1 << 31) - 1))
def test_partition_round_trip(tenant: str, local: str, index: int) -> None:
    base = TopicName.parse(f"persistent://{tenant}/ns/{local}")
    partition = base.partition(index)
    assert partition.partition_index == index
    if not base.is_partitioned:
        assert partition.partitioned_base == base


# -- length limits: every metadata key a valid name makes fits the store --------------------

def _keys_of(name: TopicName) -> list[bytes]:
    """Every metadata key a topic and its partitions make, with the longest subscription."""
    from magnetar.broker.ledger._managed_ledger import ml_key
    from magnetar.broker.ledger._ml_records import cursor_key
    from magnetar.broker.schemas._schemas import SchemaRegistry

    longest_sub = "s" * SUBSCRIPTION_NAME_BYTES_MAX
    keys: list[bytes] = []
    for each in (name, name.partition(2**31 - 1)):
        keys += [ml_key(each.persistence_name), cursor_key(each.persistence_name, longest_sub),
                 SchemaRegistry._key(each), b"topicpolicy/" + str(each).encode(),
                 b"partitioned/" + str(each).encode()]
    return keys


def _is_valid(text: str) -> bool:
    try:
        TopicName.parse(text)
    except InvalidTopicNameError:
        return False
    return True


def _longest_valid(prefix: str, unit: str) -> TopicName:
    """The topic `prefix + unit * n` for the largest n that is valid; one more is too long."""
    count = 0
    while count < METADATA_KEY_BYTES_MAX and _is_valid(prefix + unit * (count + 1)):
        count += 1
    with pytest.raises(InvalidTopicNameError, match="too long"):
        TopicName.parse(prefix + unit * (count + 1))
    return TopicName.parse(prefix + unit * count)


_PREFIXES = ("persistent://public/default/",
             "persistent://" + "t" * NAMED_ENTITY_CHARS_MAX + "/" + "n" * NAMED_ENTITY_CHARS_MAX
             + "/")
_LEGACY_PREFIX = "non-persistent://t=x/c:l/n.s/"  # its local name may hold "/"


@pytest.mark.parametrize(("prefix", "unit"), [
    *((prefix, unit) for prefix in (*_PREFIXES, _LEGACY_PREFIX)
      for unit in ("a", "*", " ", "é", "😀", ":")),
    (_LEGACY_PREFIX, "/"),
])
def test_the_longest_valid_topic_fits_every_key(prefix: str, unit: str) -> None:
    name = _longest_valid(prefix, unit)
    assert len(name.local_name) >= 10  # a useful length remains
    for key in _keys_of(name):
        assert len(key) <= METADATA_KEY_BYTES_MAX, key[:60]
    assert topic_stored_bytes(name) <= TOPIC_STORED_NAME_BYTES_MAX


def test_limits_are_tied_to_the_store() -> None:
    from magnetar.storage._metadata import META_KEY_BYTES_MAX

    assert METADATA_KEY_BYTES_MAX == META_KEY_BYTES_MAX == 511
    assert TOPIC_STORED_NAME_BYTES_MAX + SUBSCRIPTION_NAME_BYTES_MAX + len(b"cursor/\x00") \
        == METADATA_KEY_BYTES_MAX


def test_an_over_long_topic_is_invalid_in_every_form() -> None:
    local = "x" * 600
    for text in (local, f"public/default/{local}", f"persistent://public/default/{local}",
                 f"persistent://public/default/{local}-partition-3"):
        with pytest.raises(InvalidTopicNameError, match="too long"):
            TopicName.parse(text)
    with pytest.raises(InvalidTopicNameError, match="too long"):
        TopicName("persistent", "public", "default", local)  # as the admin API builds it
    with pytest.raises(InvalidTopicNameError) as caught:
        TopicName.parse("y" * 5_000_000)
    assert len(str(caught.value)) < 400  # the name is quoted, not echoed whole


def test_partitions_of_a_valid_name_are_valid() -> None:
    base = _longest_valid("persistent://public/default/", "p")
    assert TopicName.parse(str(base.partition(2**31 - 1))).partitioned_base == base


@pytest.mark.parametrize("text", ["t" * (NAMED_ENTITY_CHARS_MAX + 1) + "/ns",
                                  "t/" + "n" * (NAMED_ENTITY_CHARS_MAX + 1),
                                  "t/" + "c" * (NAMED_ENTITY_CHARS_MAX + 1) + "/ns"])
def test_over_long_namespace_parts_are_invalid(text: str) -> None:
    with pytest.raises(InvalidTopicNameError, match="Invalid namespace format") as caught:
        NamespaceName.parse(text)
    assert "longer than" in str(caught.value.__cause__)
    with pytest.raises(InvalidTopicNameError, match="longer than"):
        TopicName.parse(f"persistent://{text}/t")
    NamespaceName.parse(text.replace("t" * (NAMED_ENTITY_CHARS_MAX + 1), "t")
                        .replace("n" * (NAMED_ENTITY_CHARS_MAX + 1), "n")
                        .replace("c" * (NAMED_ENTITY_CHARS_MAX + 1), "c"))
    with pytest.raises(InvalidTopicNameError):
        check_tenant_name("t" * (NAMED_ENTITY_CHARS_MAX + 1))
    check_tenant_name("t" * NAMED_ENTITY_CHARS_MAX)


def test_subscription_and_producer_name_limits_count_utf8_bytes() -> None:
    check_subscription_name("s" * SUBSCRIPTION_NAME_BYTES_MAX)
    check_producer_name("p" * PRODUCER_NAME_BYTES_MAX)
    with pytest.raises(ProducerBusyError, match="too long"):
        check_subscription_name("é" * (SUBSCRIPTION_NAME_BYTES_MAX // 2 + 1))
    with pytest.raises(ProducerBusyError, match="too long"):
        check_producer_name("p" * (PRODUCER_NAME_BYTES_MAX + 1))
