"""Harnesses around the storage engine, kept out of `import storage`: the crash-recovery
harness (`magnetar crashtest`), the storage benchmark (`magnetar bench storage`) and the
fault-injecting file system the tests and the harnesses share (`SimFileSystem`).

Import the module you need (`storage.testing.simfs`, `storage.testing.crashtest`,
`storage.testing.benchmark`); this package imports nothing itself, so loading one harness does
not load the others or their optional dependencies (tqdm, matplotlib).
"""
