"""Magnetar: Apache Pulsar's messaging model on a BookKeeper-style storage engine.

Everything installs under this one name: `magnetar.storage` (the storage engine),
`magnetar.codec` (the Pulsar wire codec) and `magnetar.broker` (the broker). Importing
`magnetar` alone loads none of them.
"""
