"""Magnetar broker: Pulsar's messaging model on top of `storage` and `codec`."""

__all__: list[str] = []
