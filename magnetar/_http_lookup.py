"""`HttpLookup`: discovery over HTTP for `Client("http://host:8080")`, as Pulsar's clients do it.

With an `http://` or `https://` service URL the client asks the broker's admin server where a
topic lives (`GET /lookup/v2/topic/...`, Pulsar's LookupData: `brokerUrl`, `brokerUrlTls`), how
many partitions it has (`GET /admin/v2/.../partitions?checkAllowAutoCreation=true`) and which
topics a namespace holds (`GET /admin/v2/namespaces/.../topics?mode=...`), and then speaks the
binary protocol to the broker URL it was given (`_tcp.py`). A token goes in `Authorization:
Bearer`. Non-2xx answers become the client's
exceptions: 404 `TopicNotFound`, 412 `InvalidTopicName`, others `LookupError`, each with the
server's `reason`. aiohttp is imported only when such a client is created.
"""

from __future__ import annotations

import json
import ssl
from typing import Any

from ._auth import AuthenticationToken
from ._errors import ConnectError, InvalidTopicName, LookupError, PulsarException, TopicNotFound

__all__ = ["HttpLookup"]


def _topic_path(topic: str) -> str:
    """`persistent://t/ns/x` -> `persistent/t/ns/x` (the name's parts, URL-quoted)."""
    from urllib.parse import quote

    domain, _, rest = topic.partition("://")
    parts = rest.split("/")
    if not domain or len(parts) != 3:
        raise InvalidTopicName(f"{topic!r} is not a complete topic name")
    return "/".join([domain, *(quote(p, safe="") for p in parts)])


class HttpLookup:
    """Lookups against one admin server (see the module comment)."""

    def __init__(self, url: str, ssl_context: ssl.SSLContext | None, timeout_s: float,
                 authentication: AuthenticationToken | None = None):
        self.url = url.rstrip("/")
        self._auth = authentication
        self.tls = url.startswith("https://")
        self._ssl = ssl_context if self.tls else None
        self._timeout_s = timeout_s
        self._session: Any = None

    async def _get(self, path: str, where: str) -> Any:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout_s))
        try:
            headers = {} if self._auth is None else \
                {"Authorization": f"Bearer {self._auth.token()}"}
            async with self._session.get(self.url + path, ssl=self._ssl,
                                         headers=headers) as answer:
                body = await answer.text()
                status = answer.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ConnectError(f"{where}: cannot reach {self.url}: "
                               f"{exc or type(exc).__name__}") from None
        if status // 100 == 2:
            try:
                return json.loads(body)
            except ValueError:
                raise LookupError(f"{where}: {self.url} answered no JSON") from None
        try:
            reason = json.loads(body).get("reason", body)
        except (ValueError, AttributeError):
            reason = body
        kind: type[PulsarException] = {404: TopicNotFound, 412: InvalidTopicName}.get(
            status, LookupError)
        raise kind(f"{where}: {self.url} answered {status}: {reason}")

    async def check(self) -> None:
        """Reach the server once (the client's construction fails early when it cannot)."""
        await self._get("/admin/v2/clusters", "connect")

    async def broker_url(self, topic: str) -> str:
        data = await self._get(f"/lookup/v2/topic/{_topic_path(topic)}", f"lookup of {topic}")
        url = (data.get("brokerUrlTls") if self.tls else None) or data.get("brokerUrl")
        if not isinstance(url, str) or not url:
            raise LookupError(f"lookup of {topic}: {self.url} named no broker URL")
        return url

    async def partitions(self, topic: str) -> int:
        data = await self._get(f"/admin/v2/{_topic_path(topic)}/partitions"
                               "?checkAllowAutoCreation=true", f"partitions of {topic}")
        return int(data.get("partitions", 0))

    async def topics(self, namespace: str, mode: str) -> list[str]:
        data = await self._get(f"/admin/v2/namespaces/{namespace}/topics?mode={mode}",
                               f"topics of {namespace}")
        return [str(t) for t in data]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
