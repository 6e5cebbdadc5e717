"""Managed ledgers on storage: the ledger list, cursors, positions, range sets and persisted
redelivery counts.
"""
