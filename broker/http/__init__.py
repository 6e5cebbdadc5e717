"""The HTTP side: the REST v2 admin API, schema routes, admin authentication, HTTP lookup, metrics
and stats.
"""
