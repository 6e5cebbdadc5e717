"""The admin REST API's topic compaction (`topics/_compaction.py`), as Pulsar answers it:

* `PUT .../{topic}/compaction`: start compacting the topic (each partition of a partitioned
  topic) in the background: 204; 409 "Compaction already in progress" when one runs (then
  nothing is started); 404 for a topic that does not exist; 405 for a non-persistent one.
* `GET .../{topic}/compaction`: Pulsar's LongRunningProcessStatus of the last compaction,
  `{"status": "NOT_RUN"|"RUNNING"|"SUCCESS"|"ERROR", "lastError": "..."}`.
"""

from __future__ import annotations

from aiohttp import web

from ..topics._topic import PersistentTopic
from ._rest import (
    TOPIC_PATH,
    RestError,
    _not_found,
    _ok,
    _persistent,
    _service,
    _targets,
    _topic_name,
)

__all__ = ["add_compaction_routes"]


async def trigger_compaction(request: web.Request) -> web.Response:
    service = _service(request)
    name = _topic_name(request)
    targets = await _targets(service, name)
    if not targets:
        raise _not_found(name)
    topics = [t for t in targets if isinstance(t, PersistentTopic)]
    if len(topics) != len(targets):
        raise RestError(405, "Compaction is not allowed on a non-persistent topic")
    if any(topic.compaction.running for topic in topics):
        raise RestError(409, "Compaction already in progress")
    for topic in topics:
        topic.compaction.trigger()
    return _ok()


async def compaction_status(request: web.Request) -> web.Response:
    topic = await _persistent(_service(request), _topic_name(request))
    return _ok(topic.compaction.stats())


def add_compaction_routes(router: web.UrlDispatcher) -> None:
    """Register `PUT` and `GET .../{topic}/compaction`."""
    router.add_put(TOPIC_PATH + "/compaction", trigger_compaction)
    router.add_get(TOPIC_PATH + "/compaction", compaction_status)
