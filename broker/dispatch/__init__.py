"""Subscriptions and what they deliver: the dispatchers, selectors, draining, pending acks, delayed
delivery, consumers and the entry view.
"""
