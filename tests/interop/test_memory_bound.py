"""The broker's memory stays bounded under load: measured from outside, as the resident set
(VmRSS in /proc/<pid>/status) of the broker subprocess.

* Continuous publishing with a consumer that never reads or acks (its permits run out, the
  backlog grows on disk, not in memory): after a warm-up the RSS stops growing -- the last
  samples stay within `GROWTH_AFTER_WARMUP_MB_MAX` of the mid-run sample. Short in the default
  suite, a minute behind `slow`.
* A client that grants huge permits and then stops reading while a large backlog is pushed to
  it: the broker's writes must pause at the socket's high-water mark instead of queueing the
  whole backlog in memory.

The measured figures are printed (run with -s)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from magnetar.codec import pb

from . import BrokerProcess, RawClient
from .conftest import new_client

pytestmark = pytest.mark.interop

MB = 1024 * 1024
MESSAGE_BYTES = 1024
SAMPLE_INTERVAL_S = 0.25
GROWTH_AFTER_WARMUP_MB_MAX = 40  # last samples vs the mid-run sample
RSS_MB_MAX = 600  # absolute ceiling during the run
BACKLOG_MESSAGES = 500
BACKLOG_MESSAGE_BYTES = 100 * 1024
STALLED_READER_GROWTH_MB_MAX = 25  # the backlog is ~49 MB; a read (5 MB), the write buffer,
#                                     caches and malloc arenas fit below; buffering it all does not
PERMITS_HUGE = 1_000_000


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    process.start()
    yield process
    process.cleanup()


def rss_mb(process: BrokerProcess) -> float:
    """The broker subprocess's resident set size in MB."""
    assert process.process is not None
    for line in Path(f"/proc/{process.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS line")


def _publish_for(process: BrokerProcess, seconds: float) -> tuple[list[float], int]:
    """Publish continuously for `seconds` with a consumer that never reads and a subscription
    without consumers; returns the RSS samples and the number of messages published."""
    client = new_client(process.url)
    try:
        topic = "persistent://public/default/memory-bound"
        idle = client.subscribe(topic, "never-reads", receiver_queue_size=10)
        client.subscribe(topic, "backlog").close()
        producer = client.create_producer(topic, batching_enabled=False,
                                          max_pending_messages=500, block_if_queue_full=True)
        body = b"m" * MESSAGE_BYTES
        samples = [rss_mb(process)]
        sent = 0
        end = time.monotonic() + seconds
        next_sample = time.monotonic() + SAMPLE_INTERVAL_S
        while time.monotonic() < end:
            producer.send_async(body, None)
            sent += 1
            if time.monotonic() >= next_sample:
                samples.append(rss_mb(process))
                next_sample += SAMPLE_INTERVAL_S
        producer.flush()
        samples.append(rss_mb(process))
        idle.close()
        return samples, sent
    finally:
        client.close()


def _check_bounded(samples: list[float], sent: int, seconds: float) -> None:
    mid = samples[len(samples) // 2]
    tail = samples[-max(3, len(samples) // 10):]
    print(f"published {sent} x {MESSAGE_BYTES} B in {seconds} s ({sent * MESSAGE_BYTES / MB:.1f}"
          f" MB); RSS start {samples[0]:.1f} MB, mid {mid:.1f} MB, end {samples[-1]:.1f} MB,"
          f" max {max(samples):.1f} MB over {len(samples)} samples")
    assert sent > 0
    assert max(samples) < RSS_MB_MAX
    assert max(tail) <= mid + GROWTH_AFTER_WARMUP_MB_MAX, samples


def test_rss_bounded_under_continuous_publishing(own_broker: BrokerProcess) -> None:
    seconds = 6.0
    samples, sent = _publish_for(own_broker, seconds)
    _check_bounded(samples, sent, seconds)


@pytest.mark.slow
def test_rss_bounded_for_a_minute(own_broker: BrokerProcess) -> None:
    seconds = 60.0
    samples, sent = _publish_for(own_broker, seconds)
    _check_bounded(samples, sent, seconds)


def test_a_client_that_stops_reading_does_not_fill_the_broker(own_broker: BrokerProcess) -> None:
    topic = "persistent://public/default/stalled-reader"
    client = new_client(own_broker.url)
    try:
        client.subscribe(topic, "stalled").close()  # the backlog starts at message 0
        producer = client.create_producer(topic, batching_enabled=False)
        body = b"b" * BACKLOG_MESSAGE_BYTES
        for _ in range(BACKLOG_MESSAGES):
            producer.send_async(body, None)
        producer.flush()
    finally:
        client.close()
    before = rss_mb(own_broker)
    reader = RawClient(own_broker.port)
    try:
        reader.handshake()
        reader.request(pb.CommandSubscribe(topic=topic, subscription="stalled", consumer_id=1,
                                           request_id=1, subType=pb.CommandSubscribe.Exclusive),
                       pb.BaseCommand.SUCCESS)
        reader.send(pb.CommandFlow(consumer_id=1, messagePermits=PERMITS_HUGE))
        peak = before
        end = time.monotonic() + 3.0
        while time.monotonic() < end:  # measuring over a window, not waiting for a condition
            peak = max(peak, rss_mb(own_broker))
            time.sleep(SAMPLE_INTERVAL_S)
        backlog_mb = BACKLOG_MESSAGES * BACKLOG_MESSAGE_BYTES / MB
        print(f"stalled reader: backlog {backlog_mb:.1f} MB, RSS before {before:.1f} MB, "
              f"peak {peak:.1f} MB (+{peak - before:.1f} MB)")
        assert peak - before < STALLED_READER_GROWTH_MB_MAX
        delivered = [reader.expect(pb.BaseCommand.MESSAGE).body.message_id.entryId
                     for _ in range(BACKLOG_MESSAGES)]  # reading again resumes the deliveries
        assert delivered == sorted(delivered)
        assert len(set(delivered)) == BACKLOG_MESSAGES
    finally:
        reader.close()
    healthy = new_client(own_broker.url)
    try:
        healthy.create_producer(topic).send(b"still fine")
    finally:
        healthy.close()
    assert own_broker.process is not None
    assert own_broker.process.poll() is None
