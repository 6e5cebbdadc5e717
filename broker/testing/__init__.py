"""The broker's harnesses (not loaded by `import broker`): the seeded simulation of the
service (`_simulation`) and the crash-recovery harness for the whole broker (`crashtest`,
`magnetar crashtest broker`)."""
