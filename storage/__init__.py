"""Magnetar storage: a BookKeeper-style ledger store (journal, entry logs, LMDB index).

The public surface is re-exported here; modules with a leading underscore are internal.
"""

__all__: list[str] = []
