"""The kill-mode child of `magnetar crashtest`: run the real threaded engine until killed.

    python -m magnetar.storage.testing._crashtest_child --data-dir DIR --seed S --iteration I

The child opens (recovering) the data directory with background threads on, writes `R` on
stdout, and starts `WRITERS` threads that never stop on their own. Each thread owns some
ledgers (the open ones it creates, and the recovered ones whose id falls to it) and loops
over seeded choices: a batch of adds left in flight together (sometimes fenced or closed
while they are still in flight), a fence, a close, a create, a journaled metadata-store
update, an explicit checkpoint or GC. Ledgers that grow past a size limit are closed;
sealed ones are deleted oldest first, so the directory stays bounded over any number of
iterations.

Every acknowledgement goes to stdout as one line (`storage.testing._crash_model` lists the
format), written by one `os.write` from the thread that saw the completion finish; a delete
is announced before it is requested. The parent reads the pipe after the SIGKILL.

Anything unexpected (an engine error on a healthy disk, a completion with the wrong
entry id) is reported as an `X` line and the child exits with status 2; a closed pipe
(the parent is gone) makes it exit with status 3. It also exits on its own after
`--lifetime-s` seconds, which the parent reports as a child that was never killed.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import NoReturn

from .._completion import Completion
from .._ledger import OPEN, LedgerInfo
from .._storage import Storage
from ._crash_model import (
    entry_payload,
    kill_config,
    ledger_metadata,
    meta_value,
    meta_version,
    payload_digest,
)

WRITERS = 4
LEDGERS_OPEN_MAX = 3
LEDGERS_RETIRED_MAX = 2
ENTRIES_PER_LEDGER_MAX = 96
BATCH_ENTRIES_MAX = 48
META_KEYS_PER_WRITER = 2
COMPLETION_WAIT_S_MAX = 60.0
LINE_BYTES_MAX = 3000  # below PIPE_BUF, so one write is one atomic line
EXIT_ERROR = 2
EXIT_PIPE_GONE = 3


class Channel:
    """The side channel: one atomic `os.write` per line."""

    def __init__(self, fd: int):
        self._fd = fd

    def send(self, line: str) -> None:
        raw = (line[:LINE_BYTES_MAX] + "\n").encode("ascii", "replace")
        try:
            written = os.write(self._fd, raw)
        except OSError:
            os._exit(EXIT_PIPE_GONE)
        assert written == len(raw)

    def fail(self, exc: BaseException) -> NoReturn:
        """Report an unexpected error and end the process at once."""
        text = "".join(traceback.format_exception(exc)).strip().replace("\n", " | ")
        self.send(f"X {text}")
        os._exit(EXIT_ERROR)


class Writer(threading.Thread):
    """One writer thread (see the module comment)."""

    def __init__(self, number: int, store: Storage, channel: Channel, seed: int,
                 rng: random.Random, ledgers: list[LedgerInfo]):
        super().__init__(name=f"crashtest-writer-{number}", daemon=True)
        self.store = store
        self.channel = channel
        self.seed = seed
        self.rng = rng
        self.open = {i.ledger_id: i.last_add_confirmed + 1 for i in ledgers if i.state == OPEN}
        self.retired = [i.ledger_id for i in ledgers if i.state != OPEN]
        keys = [f"crashtest/kill/{number}/{k}".encode() for k in range(META_KEYS_PER_WRITER)]
        self.meta_versions = {key: meta_version(seed, key, store.metadata.get(key))
                              for key in keys}

    def run(self) -> None:
        try:
            while True:
                self._step()
        except BaseException as exc:
            self.channel.fail(exc)

    def _step(self) -> None:
        choice = self.rng.random()
        if not self.open or (choice < 0.06 and len(self.open) < LEDGERS_OPEN_MAX):
            self._create()
        elif choice < 0.78:
            self._add_batch(self.rng.choice(sorted(self.open)))
        elif choice < 0.84:
            self._seal("fence", self.rng.choice(sorted(self.open)), [])
        elif choice < 0.90:
            self._seal("close", self.rng.choice(sorted(self.open)), [])
        elif choice < 0.93:
            self._update_meta()
        elif choice < 0.97:
            self.store.checkpoint()
            mark = self.store.index.persisted_mark
            if mark is not None:
                self.channel.send(f"M {mark.segment_id} {mark.offset} {mark.lsn}")
        else:
            self.store.gc()
        while len(self.retired) > LEDGERS_RETIRED_MAX:
            self._delete(self.retired.pop(0))

    def _create(self) -> None:
        ledger_id = self.store.create_ledger(ledger_metadata(self.seed)).result(
            COMPLETION_WAIT_S_MAX)
        self.channel.send(f"C {ledger_id}")
        self.open[ledger_id] = 0

    def _add_batch(self, ledger_id: int) -> None:
        in_flight: list[Completion[int]] = []
        for _ in range(self.rng.randint(1, BATCH_ENTRIES_MAX)):
            entry_id = self.open[ledger_id]
            data = entry_payload(self.seed, ledger_id, entry_id)
            completion = self.store.add_entry(ledger_id, data)
            completion.add_done_callback(self._on_add(ledger_id, entry_id, data))
            in_flight.append(completion)
            self.open[ledger_id] = entry_id + 1
        if self.open[ledger_id] >= ENTRIES_PER_LEDGER_MAX:
            self._seal("close", ledger_id, in_flight)
        elif self.rng.random() < 0.1:
            self._seal(self.rng.choice(["fence", "close"]), ledger_id, in_flight)
        for completion in in_flight:
            completion.result(COMPLETION_WAIT_S_MAX)

    def _on_add(self, ledger_id: int, entry_id: int, data: bytes,
                ) -> _AddCallback:
        line = f"A {ledger_id} {entry_id} {len(data)} {payload_digest(data)}"
        return _AddCallback(self.channel, line, entry_id)

    def _seal(self, kind: str, ledger_id: int, in_flight: list[Completion[int]]) -> None:
        """Fence or close a ledger, possibly with its adds still in flight."""
        expected = self.open.pop(ledger_id) - 1
        call = self.store.fence if kind == "fence" else self.store.close_ledger
        last = call(ledger_id).result(COMPLETION_WAIT_S_MAX)
        assert last == expected, f"{kind} of ledger {ledger_id} gave {last}, expected {expected}"
        self.channel.send(f"{'F' if kind == 'fence' else 'L'} {ledger_id} {last}")
        self.retired.append(ledger_id)

    def _update_meta(self) -> None:
        """A journaled metadata-store update (the path cursor positions take)."""
        key = self.rng.choice(sorted(self.meta_versions))
        current = self.meta_versions[key]
        version = (current if current is not None else -1) + 1
        self.meta_versions[key] = version
        self.channel.send(f"m {key.decode()} {version}")
        completion = self.store.metadata.apply_journaled([(key, meta_value(self.seed, key,
                                                                            version))])
        completion.result(COMPLETION_WAIT_S_MAX)
        self.channel.send(f"K {key.decode()} {version}")

    def _delete(self, ledger_id: int) -> None:
        self.channel.send(f"d {ledger_id}")
        self.store.delete_ledger(ledger_id).result(COMPLETION_WAIT_S_MAX)
        self.channel.send(f"D {ledger_id}")


class _AddCallback:
    """Runs in the journal's syncer thread when an add finishes: report the ack."""

    __slots__ = ("_channel", "_entry_id", "_line")

    def __init__(self, channel: Channel, line: str, entry_id: int):
        self._channel = channel
        self._line = line
        self._entry_id = entry_id

    def __call__(self, completion: Completion[int]) -> None:
        error = completion.exception()
        if error is not None:
            self._channel.fail(error)
        elif completion.result(0) != self._entry_id:
            self._channel.send(f"X add acknowledged as entry {completion.result(0)}, "
                               f"expected {self._line}")
            os._exit(EXIT_ERROR)
        else:
            self._channel.send(self._line)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m magnetar.storage.testing._crashtest_child",
                                     description="kill-mode child of magnetar crashtest")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--iteration", type=int, required=True)
    parser.add_argument("--lifetime-s", type=float, default=120.0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    channel = Channel(sys.stdout.fileno())
    rng = random.Random(f"{args.seed}/kill/{args.iteration}/child")
    try:
        store = Storage.open(args.data_dir, kill_config(rng))
        ledgers = store.list_ledgers()
    except BaseException as exc:
        channel.fail(exc)
    channel.send("R")
    for number in range(WRITERS):
        owned = [i for i in ledgers if i.ledger_id % WRITERS == number]
        Writer(number, store, channel, args.seed, random.Random(rng.getrandbits(64)),
               owned).start()
    threading.Event().wait(args.lifetime_s)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
