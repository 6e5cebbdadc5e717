"""Test seams and harnesses of the storage engine, kept out of `import storage`: the
crash-recovery harness (`magnetar crashtest`), the storage benchmark (`magnetar bench
storage`), the fault-injecting file system the tests and the harnesses share
(`simfs.SimFileSystem`) and the in-memory ledger storage with scripted failures
(`memory.InMemoryLedgerStorage`).

Import the module you need (`storage.testing.simfs`, `storage.testing.crashtest`,
`storage.testing.benchmark`, `storage.testing.memory`); this package imports nothing itself,
so loading one harness does not load the others or their optional dependencies (tqdm,
matplotlib).
"""
