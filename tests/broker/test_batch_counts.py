"""Counts and sizes a client claims, bounded before the broker works in proportion to them
(issue 10, item 4): ack-set words in linear time, batch counts against what the payload can
hold, topic patterns on RE2."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.broker._names import matches_topics_pattern
from magnetar.broker.dispatch._entry import (
    MESSAGES_IN_BATCH_MAX,
    SINGLE_MESSAGE_BYTES_MIN,
    batch_count_error,
    messages_in,
)
from magnetar.broker.ledger._position import (
    ack_set_to_int,
    ack_set_words_max,
    int_to_ack_set,
    unacked_in_ack_set,
)
from magnetar.codec import CompressionType, SingleMessage, build_batch, pb

HUGE_WORDS = 1 << 20  # the quadratic conversions needed minutes for this many words


@given(st.lists(st.integers(-(2 ** 63), 2 ** 63 - 1), max_size=40))
def test_ack_set_words_and_mask_agree_bit_by_bit(words: list[int]) -> None:
    mask = ack_set_to_int(words)
    for bit in range(64 * len(words)):
        assert (mask >> bit) & 1 == (words[bit // 64] >> (bit % 64)) & 1
    back = int_to_ack_set(mask)
    assert ack_set_to_int(back) == mask
    assert not back or back[-1] != 0  # the shortest form
    assert all(-(2 ** 63) <= word < 2 ** 63 for word in back)


@pytest.mark.timeout(60)  # a hang guard, not a speed test: linear takes well under a second
def test_ack_set_conversions_of_a_huge_set_finish() -> None:
    mask = ack_set_to_int([-1] * HUGE_WORDS)
    assert len(int_to_ack_set(mask)) == HUGE_WORDS
    assert unacked_in_ack_set([-1] * HUGE_WORDS, 64 * HUGE_WORDS) == 64 * HUGE_WORDS


@pytest.mark.parametrize(("batch_size", "words_max"), [(1, 1), (64, 1), (65, 2), (1000, 16)])
def test_an_ack_set_needs_a_word_per_64_messages(batch_size: int, words_max: int) -> None:
    assert ack_set_words_max(batch_size) == words_max


def test_unacked_counts_only_indexes_inside_the_batch() -> None:
    assert unacked_in_ack_set([-1, -1, -1], 70) == 70
    assert unacked_in_ack_set([0b1010], 3) == 1
    assert unacked_in_ack_set([], 5) == 0


def _batch(count: int, compression: CompressionType = CompressionType.NONE,
           ) -> tuple[pb.MessageMetadata, bytes]:
    return build_batch([SingleMessage(b"x" * 10, sequence_id=i) for i in range(count)],
                       producer_name="p", publish_time=1, compression=compression)


def test_an_honest_batch_passes_and_absurd_counts_are_named() -> None:
    metadata, payload = _batch(5)
    assert batch_count_error(metadata, len(payload)) is None
    assert messages_in(metadata, len(payload)) == 5
    capacity = len(payload) // SINGLE_MESSAGE_BYTES_MIN
    for claimed, words in ((0, "below 1"), (-2 ** 31, "below 1"),
                           (MESSAGES_IN_BATCH_MAX + 1, "above the limit"),
                           (capacity + 1, "more than the payload can hold")):
        metadata.num_messages_in_batch = claimed
        problem = batch_count_error(metadata, len(payload))
        assert problem is not None, claimed
        assert words in problem, (claimed, problem)
        assert 1 <= messages_in(metadata, len(payload)) <= capacity  # a stored one, clamped
    plain = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    assert batch_count_error(plain, 0) is None
    assert messages_in(plain, 0) == 1


def test_a_compressed_batch_is_bounded_by_its_uncompressed_size() -> None:
    metadata, payload = _batch(200, CompressionType.ZSTD)
    assert len(payload) < 200 * SINGLE_MESSAGE_BYTES_MIN  # compressed below the minimum...
    assert batch_count_error(metadata, len(payload)) is None  # ...but counted uncompressed
    metadata.num_messages_in_batch = metadata.uncompressed_size // SINGLE_MESSAGE_BYTES_MIN + 1
    assert batch_count_error(metadata, len(payload)) is not None


@pytest.mark.timeout(60)  # a hang guard, not a speed test: `re` needs hours for this one
def test_a_backtracking_pattern_matches_without_backtracking() -> None:
    topic = "persistent://public/default/" + "a" * 40 + "!"
    assert not matches_topics_pattern("persistent://public/default/(a+)+", topic)


@pytest.mark.parametrize("java_only", [r"(a)\1", "(?=a).*", "(?<!b)a", "a*+"])
def test_java_syntax_re2_lacks_is_an_invalid_pattern(java_only: str) -> None:
    with pytest.raises(re.error):
        matches_topics_pattern(f"persistent://public/default/{java_only}", "public/default/a")
