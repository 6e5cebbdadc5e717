"""The broker's CPU per unbatched SEND, per thread, driven over a raw socket.

What is measured
----------------
A broker subprocess (`magnetar standalone`, from this checkout or `--root`) is sent 1 KB
unbatched SENDs by a sans-IO client in this process (the codec's `Connection`: no client
library's threads or batching between the driver and the socket), durable as always, for a
fixed time per workload, then drained:

* **one producer**: `PENDING_ONE` SENDs in flight;
* **many producers**: `--producers` producers on as many topics of one connection,
  `PENDING_MANY` in flight each, sent round the producers one SEND at a time (as the official
  client's publish loop in `e2e_many_topics.py` does), so a socket read holds a SEND or two of
  each producer.

For each: messages/s, and the broker's CPU time (user + system, from /proc) per message, in
all and for its main thread (the event loop) apart from its other threads (the storage's).
On a machine shared with other work, the CPU per message is the steady figure; the rate is
the machine's. With `--before ROOT` the two checkouts alternate round by round.

    python benchmarks/bench_send.py --quick
    python benchmarks/bench_send.py --before /path/to/main --rounds 3
"""

from __future__ import annotations

import argparse
import os
import selectors
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_e2e import REPO_ROOT, BrokerProcess

from magnetar.codec import Connection, Frame, Role, base_command, encode_entry, pb

PENDING_ONE = 1000  # SENDs in flight with one producer
PENDING_MANY = 100  # ... and per producer with many
MESSAGE_BYTES = 1024
DRAIN_DEADLINE_S = 60.0
READ_BYTES_MAX = 1 << 20

T = pb.BaseCommand


@dataclass
class Result:
    workload: str
    messages: int
    seconds: float
    main_cpu_s: float  # the broker's main thread
    other_cpu_s: float  # its other threads

    def per_s(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    def us_per_message(self, cpu_s: float) -> float:
        return cpu_s / self.messages * 1e6 if self.messages else 0.0

    def line(self) -> str:
        return (f"{self.workload:24s} {self.per_s():>9,.0f}/s  broker CPU "
                f"{self.us_per_message(self.main_cpu_s + self.other_cpu_s):6.1f} us/msg "
                f"(main {self.us_per_message(self.main_cpu_s):.1f}, "
                f"others {self.us_per_message(self.other_cpu_s):.1f})")


def thread_cpu_s(pid: int) -> tuple[float, float]:
    """(main thread, all other threads) CPU seconds of a process so far (Linux /proc)."""
    main = others = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue  # a thread that just ended
        cpu = (int(fields[11]) + int(fields[12])) / tick
        if int(tid) == pid:
            main = cpu
        else:
            others += cpu
    return main, others


class Driver:
    """One connection sending SENDs for `producers` producers (sans-IO over a socket)."""

    def __init__(self, port: int, producers: int, topic: str):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn = Connection(Role.CLIENT)
        self._send(pb.CommandConnect(client_version="bench_send", protocol_version=20))
        self._expect(T.CONNECTED)
        self.names = []
        for producer_id in range(producers):
            self._send(pb.CommandProducer(topic=f"persistent://public/default/{topic}-"
                                          f"{producer_id}", producer_id=producer_id,
                                          request_id=producer_id))
            self.names.append(self._expect(T.PRODUCER_SUCCESS).command.producer_success
                              .producer_name)
        self.payload = os.urandom(MESSAGE_BYTES)
        self.sequence = [0] * producers

    def _send(self, body: object) -> None:
        self.sock.sendall(self.conn.send(base_command(body)))  # type: ignore[arg-type]

    def _expect(self, kind: int) -> Frame:
        while True:
            for event in self.conn.events():
                assert isinstance(event, Frame), event
                if event.type == kind:
                    return event
                if event.type != T.PING:
                    raise RuntimeError(f"expected {T.Type.Name(kind)}: {event.command}")
                self._send(pb.CommandPong())
            data = self.sock.recv(READ_BYTES_MAX)
            if not data:
                raise RuntimeError("the broker closed the connection")
            self.conn.receive_data(data)

    def frame(self, producer_id: int) -> bytes:
        sequence_id = self.sequence[producer_id]
        self.sequence[producer_id] += 1
        metadata = pb.MessageMetadata(producer_name=self.names[producer_id],
                                      sequence_id=sequence_id,
                                      publish_time=int(time.time() * 1000))
        return self.conn.send(base_command(pb.CommandSend(
            producer_id=producer_id, sequence_id=sequence_id, num_messages=1)),
            entry=encode_entry(metadata, self.payload))

    def run(self, seconds: float, pending: int) -> tuple[int, float]:
        """Send round the producers, each with at most `pending` unreceipted, for `seconds`;
        then wait for every receipt. Returns (receipts, seconds to the last)."""
        producers = len(self.names)
        in_flight = [0] * producers
        done = 0
        out = bytearray()
        self.sock.setblocking(False)
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ)
        started = time.perf_counter()
        stop_at, deadline = started + seconds, started + seconds + DRAIN_DEADLINE_S
        try:
            while True:
                now = time.perf_counter()
                sending = now < stop_at
                if sending:
                    added = True
                    while added:  # one SEND per producer per pass
                        added = False
                        for producer_id in range(producers):
                            if in_flight[producer_id] < pending:
                                out += self.frame(producer_id)
                                in_flight[producer_id] += 1
                                added = True
                elif not any(in_flight):
                    return done, time.perf_counter() - started
                elif now > deadline:
                    raise RuntimeError(f"{sum(in_flight)} SENDs were never receipted")
                if out:
                    try:
                        del out[:self.sock.send(out)]
                    except BlockingIOError:
                        pass
                for _ in selector.select(0.01):
                    done += self._receipts(in_flight, out)
        finally:
            selector.close()
            self.sock.setblocking(True)

    def _receipts(self, in_flight: list[int], out: bytearray) -> int:
        try:
            data = self.sock.recv(READ_BYTES_MAX)
        except BlockingIOError:
            return 0
        if not data:
            raise RuntimeError("the broker closed the connection")
        self.conn.receive_data(data)
        receipts = 0
        for event in self.conn.events():
            assert isinstance(event, Frame), event
            if event.type == T.SEND_RECEIPT:
                in_flight[event.command.send_receipt.producer_id] -= 1
                receipts += 1
            elif event.type == T.PING:
                out += self.conn.send(base_command(pb.CommandPong()))
            else:
                raise RuntimeError(f"unexpected {event.command}")
        return receipts

    def close(self) -> None:
        self.sock.close()


def measure(broker: BrokerProcess, workload: str, producers: int, pending: int,
            seconds: float) -> Result:
    assert broker.process is not None
    pid = broker.process.pid
    driver = Driver(broker.port, producers, workload.replace(" ", "-"))
    try:
        main_before, others_before = thread_cpu_s(pid)
        messages, elapsed = driver.run(seconds, pending)
        main_after, others_after = thread_cpu_s(pid)
    finally:
        driver.close()
    return Result(workload, messages, elapsed, main_after - main_before,
                  others_after - others_before)


def run_round(root: str, scratch: str, seconds: float, producers: int,
              workloads: str = "both", profile_path: str | None = None) -> list[Result]:
    broker = BrokerProcess(tempfile.mkdtemp(prefix="broker-", dir=scratch),
                           profile_path=profile_path, root=root)
    broker.start()
    try:
        results = []
        if workloads in ("both", "one"):
            results.append(measure(broker, "one producer", 1, PENDING_ONE, seconds))
        if workloads in ("both", "many"):
            results.append(measure(broker, f"{producers} producers", producers, PENDING_MANY,
                                   seconds))
        return results
    finally:
        broker.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=REPO_ROOT, help="the checkout measured")
    parser.add_argument("--before", default=None, help="another checkout, alternated with it")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=None, help="per workload (4)")
    parser.add_argument("--producers", type=int, default=None, help="many producers (100)")
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--workloads", choices=("both", "one", "many"), default="both")
    parser.add_argument("--profile", default=None, metavar="PATH",
                        help="run the broker under cProfile, its stats written to PATH")
    parser.add_argument("--quick", action="store_true",
                        help="1 s per workload and 10 producers, unless given")
    args = parser.parse_args(argv)
    if args.seconds is None:
        args.seconds = 1.0 if args.quick else 4.0
    if args.producers is None:
        args.producers = 10 if args.quick else 100
    sides = {"after": args.root} if args.before is None else {"before": args.before,
                                                              "after": args.root}
    with tempfile.TemporaryDirectory(prefix="magnetar-bench-send-", dir=args.dir) as scratch:
        for round_no in range(args.rounds):
            order = list(sides) if round_no % 2 == 0 else list(reversed(sides))
            for side in order:
                for result in run_round(sides[side], scratch, args.seconds, args.producers,
                                        args.workloads, args.profile):
                    print(f"round {round_no} {side:6s} {result.line()}", flush=True)
    print(f"load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
