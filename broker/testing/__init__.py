"""The seeded broker simulation (a harness, not loaded by `import broker`)."""
