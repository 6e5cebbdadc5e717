"""Test seams and harnesses of the storage engine (not loaded by `import storage`)."""
