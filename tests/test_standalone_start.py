"""What `serve_standalone` has done by the time its binary port starts serving: the storage's
ledger table, as recovered, is out of the cyclic GC's full collections (`gc.freeze`)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from magnetar.broker.cli import _standalone
from magnetar.broker.topics._service import BrokerService
from magnetar.storage import Storage, StorageConfig


class _Served(Exception):
    """Raised by the stand-in server once it has looked (ends the run)."""


async def test_the_ledger_table_is_frozen_before_the_port_serves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data_dir = tmp_path / "data"
    storage = Storage.open(data_dir, StorageConfig())
    ledger_id = storage.create_ledger({"ml": "public/default/persistent/t"}).result(5)
    storage.close()
    seen: dict[str, bool] = {}

    async def serve(service: BrokerService, *args: object, **kwargs: object) -> None:
        ledger = service.storage.ledgers.get(ledger_id)  # type: ignore[attr-defined]
        assert ledger is not None
        tracked = gc.get_objects()  # every generation but the frozen one
        seen["ledger tracked"] = any(each is ledger for each in tracked)
        seen["metadata tracked"] = any(each is ledger.metadata for each in tracked)
        raise _Served

    monkeypatch.setattr(_standalone, "serve", serve)
    options = _standalone.StandaloneOptions(str(data_dir), port=0, http_port=0)
    try:
        with pytest.raises(_Served):
            await _standalone.serve_standalone(options)
    finally:
        gc.unfreeze()
    assert seen == {"ledger tracked": False, "metadata tracked": False}
