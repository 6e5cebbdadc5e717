"""The broker service and its topics (persistent and non-persistent), producer access modes,
deduplication and broker entry metadata.
"""
