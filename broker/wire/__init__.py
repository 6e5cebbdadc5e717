"""The Pulsar binary protocol server: the TCP server, the connection (its mechanics, and one
command handler each for producers, consumers, and lookup and discovery) and topic-list
watchers.
"""
