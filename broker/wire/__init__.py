"""The Pulsar binary protocol server: the TCP server, the per-connection handler and topic-list
watchers.
"""
