"""The fault-injecting file system itself (`storage.testing.simfs`): what a power loss may and may
not do to the bytes, determinism by seed, crash triggers, and scripted disk errors.

Every scenario runs over many seeds and checks an invariant for each, plus that each
outcome the model allows was actually produced by some seed (so a seam that silently
keeps everything would fail).
"""

from __future__ import annotations

import errno
from collections import Counter
from pathlib import Path

import pytest

from magnetar.storage.testing.simfs import SimFileSystem, SimulatedCrash

SEEDS = range(120)


def make_file(sim: SimFileSystem, path: Path, data: bytes) -> None:
    """Create `path` holding `data`, durably (data synced, directory entry synced)."""
    handle = sim.open(str(path), create=True)
    handle.pwrite(data, 0)
    handle.fdatasync()
    handle.close()
    sim.fsync_dir(str(path.parent))


def test_unsynced_writes_may_be_lost_synced_never_change(tmp_path: Path) -> None:
    synced = bytes(range(256)) * 4  # 1024 bytes, synced
    overwrite = b"\xaa" * 200  # unsynced, over synced bytes 200..399
    append = b"\xbb" * 1000  # unsynced, past the synced end
    fates: Counter[str] = Counter()
    tails: set[str] = set()
    for seed in SEEDS:
        path = tmp_path / f"f{seed}"
        sim = SimFileSystem(seed)
        make_file(sim, path, synced)
        handle = sim.open(str(path))
        handle.pwrite(append, 1024)
        handle.pwrite(overwrite, 200)
        sim.crash()
        with pytest.raises(SimulatedCrash):
            handle.pwrite(b"late", 0)
        fates.update(sim.power_loss())
        after = path.read_bytes()
        assert after[:200] == synced[:200]  # synced and never overwritten
        assert after[400:1024] == synced[400:1024]
        assert 1024 <= len(after) <= 2024
        assert explained(after[200:400], overwrite, synced[200:400])
        tail = after[1024:]
        if tail == append:
            tails.add("kept")
        elif not tail:
            tails.add("dropped")
        elif append.startswith(tail):
            tails.add("torn")
        else:
            tails.add("corrupted")
    assert {"kept", "dropped", "torn", "corrupted"} <= {k for k, v in fates.items() if v}
    assert {"kept", "dropped", "torn"} <= tails


CORRUPT_SPAN_BYTES_MAX = 64


def explained(region: bytes, new: bytes, old: bytes) -> bool:
    """Whether `region` is what one overwrite of `old` by `new` may leave after a power
    loss: a prefix of `new` followed by the rest of `old` (kept, torn or dropped), up to
    one span of at most CORRUPT_SPAN_BYTES_MAX random bytes (corrupted)."""
    assert len(region) == len(new) == len(old)
    for cut in range(len(new) + 1):
        expected = new[:cut] + old[cut:]
        wrong = [i for i, (a, b) in enumerate(zip(region, expected, strict=True)) if a != b]
        if not wrong or wrong[-1] - wrong[0] < CORRUPT_SPAN_BYTES_MAX:
            return True
    return False


def test_newer_kept_write_not_clobbered_by_older_dropped_one(tmp_path: Path) -> None:
    older = b"\x11" * 100  # bytes 0..99
    newer = b"\x22" * 100  # bytes 50..149, written after `older`
    outcomes: set[str] = set()
    for seed in SEEDS:
        path = tmp_path / f"f{seed}"
        sim = SimFileSystem(seed)
        make_file(sim, path, bytes(200))
        handle = sim.open(str(path))
        handle.pwrite(older, 0)
        handle.pwrite(newer, 50)
        sim.crash()
        sim.power_loss()
        after = path.read_bytes()
        assert len(after) == 200
        assert after[150:] == bytes(50)
        if after[100:150] == newer[:50]:
            # The newer write's end survived, so all of it did (a tear keeps a prefix),
            # whatever happened to the older one underneath.
            assert after[50:100] == newer[:50] or not_zeroed(after[50:100])
        if after[:50] == bytes(50) and after[50:150] == newer:
            outcomes.add("older dropped, newer kept")
        if after[:100] == older and after[100:150] == bytes(50):
            outcomes.add("older kept, newer dropped")
        if after[:150] == older[:50] + newer:
            outcomes.add("both kept")
    assert outcomes == {"older dropped, newer kept", "older kept, newer dropped", "both kept"}


def not_zeroed(region: bytes) -> bool:
    """Not the bytes the older write overwrote: a corrupted newer write may hold random
    bytes here, but restoring the older write's old bytes would zero it."""
    return region != bytes(len(region))


def test_files_created_without_fsync_dir_may_vanish(tmp_path: Path) -> None:
    vanished = survived = 0
    for seed in SEEDS:
        sim = SimFileSystem(seed)
        loose = tmp_path / f"loose{seed}"
        durable = tmp_path / f"durable{seed}"
        make_file(sim, durable, b"named durably")
        handle = sim.open(str(loose), create=True)
        handle.pwrite(b"data synced, name not", 0)
        handle.fdatasync()
        handle.close()
        sim.crash()
        lost = sim.power_loss()["files_lost"]
        assert durable.read_bytes() == b"named durably"
        if loose.exists():
            assert loose.read_bytes() == b"data synced, name not"
            assert lost == 0
            survived += 1
        else:
            assert lost == 1
            vanished += 1
    assert vanished > 0
    assert survived > 0


def test_keep_all_keeps_everything(tmp_path: Path) -> None:
    for seed in range(20):
        sim = SimFileSystem(seed)
        path = tmp_path / f"f{seed}"
        make_file(sim, path, b"x" * 100)
        handle = sim.open(str(path))
        handle.pwrite(b"y" * 50, 25)
        handle.pwrite(b"z" * 100, 100)
        loose = tmp_path / f"loose{seed}"
        other = sim.open(str(loose), create=True)
        other.pwrite(b"never synced", 0)
        sim.crash()
        fates = sim.power_loss(keep_all=True)
        assert fates["kept"] == 3
        assert fates["dropped"] + fates["torn"] + fates["corrupted"] + fates["files_lost"] == 0
        assert path.read_bytes() == b"x" * 25 + b"y" * 50 + b"x" * 25 + b"z" * 100
        assert loose.read_bytes() == b"never synced"


def messy_run(root: Path, seed: int) -> tuple[dict[str, bytes], dict[str, int]]:
    """Several files, synced and unsynced writes, a loose creation; power loss."""
    root.mkdir()
    sim = SimFileSystem(seed)
    for name in ("a", "b", "c"):
        make_file(sim, root / name, name.encode() * 300)
        handle = sim.open(str(root / name))
        for step in range(6):
            handle.pwrite(bytes([65 + step]) * (40 + 30 * step), 90 * step)
        if name == "b":
            handle.fdatasync()
            handle.pwrite(b"after sync" * 20, 500)
    loose = sim.open(str(root / "loose"), create=True)
    loose.pwrite(b"loose" * 50, 0)
    sim.crash()
    fates = sim.power_loss()
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}, fates


def test_same_seed_same_outcome(tmp_path: Path, seed: int) -> None:
    first = messy_run(tmp_path / "first", seed)
    second = messy_run(tmp_path / "second", seed)
    assert first == second
    others = [messy_run(tmp_path / f"other{i}", seed + 1 + i) for i in range(5)]
    assert any(other != first for other in others)


def test_truncate_and_remove_are_durable_at_once(tmp_path: Path) -> None:
    for seed in range(20):
        sim = SimFileSystem(seed)
        path = tmp_path / f"f{seed}"
        gone = tmp_path / f"gone{seed}"
        make_file(sim, path, b"k" * 100)
        make_file(sim, gone, b"doomed")
        handle = sim.open(str(path))
        handle.pwrite(b"u" * 100, 100)  # unsynced, then cut off by the truncate
        handle.truncate(60)
        sim.remove(str(gone))
        sim.crash()
        sim.power_loss()
        assert path.read_bytes() == b"k" * 60
        assert not gone.exists()


def test_crash_at_op_stops_every_later_call(tmp_path: Path) -> None:
    sim = SimFileSystem(1, crash_at_op=4)
    path = tmp_path / "f"
    handle = sim.open(str(path), create=True)  # op 1: create
    handle.pwrite(b"one", 0)  # op 2
    handle.fdatasync()  # op 3
    with pytest.raises(SimulatedCrash) as caught:
        handle.pwrite(b"two", 3)  # op 4
    assert caught.value.errno == errno.EIO
    assert sim.crashed
    assert sim.crashed_at is not None
    assert "operation 4" in sim.crashed_at
    assert path.read_bytes() == b"one"  # the crashing write never happened
    for call in (lambda: handle.pread(3, 0), handle.size, handle.fdatasync,
                 lambda: sim.open(str(path)), lambda: sim.listdir(str(tmp_path)),
                 lambda: sim.point("checkpoint:begin")):
        with pytest.raises(SimulatedCrash):
            call()


def test_crash_at_point_after_hits(tmp_path: Path) -> None:
    sim = SimFileSystem(1, crash_at_point="checkpoint:after-swap", point_hits=3)
    sim.point("checkpoint:begin")
    sim.point("checkpoint:after-swap")
    sim.point("checkpoint:after-swap")
    assert not sim.crashed
    with pytest.raises(SimulatedCrash):
        sim.point("checkpoint:after-swap")
    assert sim.crashed_at == "crash point checkpoint:after-swap"
    with pytest.raises(SimulatedCrash):
        sim.open(str(tmp_path / "x"), create=True)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_fail_writes_after_n(tmp_path: Path, code: int) -> None:
    sim = SimFileSystem(1)
    path = tmp_path / "f"
    handle = sim.open(str(path), create=True)
    sim.fail_writes(code, after=2)
    handle.pwrite(b"a", 0)
    handle.pwrite(b"b", 1)
    for _ in range(2):  # the third and every later write fail, without a crash
        with pytest.raises(OSError, match="injected") as caught:
            handle.pwrite(b"c", 2)
        assert caught.value.errno == code
        assert not isinstance(caught.value, SimulatedCrash)
    handle.fdatasync()  # syncs are not scripted to fail
    assert not sim.crashed
    assert path.read_bytes() == b"ab"
    sim.heal()
    handle.pwrite(b"c", 2)
    assert path.read_bytes() == b"abc"


def test_fail_syncs_after_n(tmp_path: Path) -> None:
    sim = SimFileSystem(1)
    path = tmp_path / "f"
    make_file(sim, path, b"")
    handle = sim.open(str(path))
    sim.fail_syncs(errno.EIO, after=1)
    handle.pwrite(b"a", 0)
    handle.fdatasync()
    handle.pwrite(b"b", 1)
    with pytest.raises(OSError, match="injected EIO") as caught:
        handle.fdatasync()
    assert caught.value.errno == errno.EIO
    with pytest.raises(OSError, match="injected EIO"):
        sim.fsync_dir(str(tmp_path))  # a directory sync is a sync too
    handle.pwrite(b"c", 2)  # writes are not scripted to fail
    assert not sim.crashed
    # The failed sync did not make "b" durable: a power loss may still take it.
    sim.crash()
    sim.power_loss()
    assert path.read_bytes()[:1] == b"a"


def test_a_started_writeback_is_not_durable(tmp_path: Path) -> None:
    """`start_writeback` only hints the disk: a power loss may still drop what it covered,
    so the engine's durability rests on the fdatasync after it, as before."""
    synced = b"\x01" * 1024
    append = b"\xcc" * 4096
    outcomes: set[str] = set()
    for seed in range(40):
        path = tmp_path / f"w{seed}"
        sim = SimFileSystem(seed)
        make_file(sim, path, synced)
        handle = sim.open(str(path))
        handle.pwrite(append, 1024)
        handle.start_writeback(1024, len(append))
        sim.crash()
        sim.power_loss()
        tail = path.read_bytes()[1024:]
        assert path.read_bytes()[:1024] == synced
        outcomes.add("kept" if tail == append else "lost" if not tail else "torn")
    assert "lost" in outcomes  # some seed dropped the writeback's bytes
