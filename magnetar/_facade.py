"""What the synchronous facade (`_client.py`) and the asyncio one (`asyncio.py`) share: one
definition of how a client starts from its arguments (`start_client`: the service URL, the
keyword arguments, the loop thread and the core's opening), of a seek's target
(`seek_target`), of a plain core call run on the loop (`on_loop`) and of a send awaited to its
id (`send_and_wait`). Each facade keeps only its own shape: blocking calls or awaits.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from magnetar.codec import MessageId as CodecMessageId

from ._auth import AuthenticationToken
from ._core import ClientCore, ClientSettings, parse_service_url
from ._errors import InvalidConfiguration
from ._loop import LoopThread
from ._message_id import MessageId, codec_id
from ._producer import OutMessage
from ._routing import ProducerSet
from ._tcp_connection import TlsSettings

if TYPE_CHECKING:
    from magnetar.broker import BrokerConfig

__all__ = ["client_settings", "on_loop", "seek_target", "send_and_wait", "start_client"]

T = TypeVar("T")
_IGNORED_CLIENT_ARGS = frozenset({"io_threads", "message_listener_threads",
                                  "concurrent_lookup_requests", "log_conf_file_path",
                                  "stats_interval_in_seconds", "use_tls", "logger",
                                  "listener_name"})


def client_settings(kwargs: dict[str, Any]) -> ClientSettings:
    """The client's keyword arguments, checked.

    Raises:
        InvalidConfiguration: a bad value. TypeError: an unknown argument."""
    authentication = kwargs.pop("authentication", None)
    if authentication is not None and not isinstance(authentication, AuthenticationToken):
        raise InvalidConfiguration("authentication must be a magnetar.AuthenticationToken "
                                   "(token authentication is the one supported)")
    unknown = set(kwargs) - _IGNORED_CLIENT_ARGS - {
        "operation_timeout_seconds", "connection_timeout_ms", "tls_trust_certs_file_path",
        "tls_allow_insecure_connection", "tls_validate_hostname", "broker_config",
        "partitions_update_interval_seconds"}
    if unknown:
        raise TypeError(f"Client() got unexpected keyword argument(s): {sorted(unknown)}")
    return ClientSettings(
        operation_timeout_s=float(kwargs.get("operation_timeout_seconds", 30)),
        connection_timeout_s=kwargs.get("connection_timeout_ms", 10000) / 1000,
        tls=TlsSettings(kwargs.get("tls_trust_certs_file_path"),
                        bool(kwargs.get("tls_allow_insecure_connection", False)),
                        bool(kwargs.get("tls_validate_hostname", False))),
        broker_config=kwargs.get("broker_config"), authentication=authentication,
        partitions_update_interval_s=_interval_s(kwargs.get(
            "partitions_update_interval_seconds", 60), "partitions_update_interval_seconds"))


def _interval_s(value: Any, name: str) -> float:
    """A non-negative number of seconds.

    Raises:
        InvalidConfiguration: not one."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidConfiguration(f"{name} must be a non-negative number of seconds, "
                                   f"not {value!r}")
    return float(value)


def start_client(service_url: str, broker_config: BrokerConfig | None, kwargs: dict[str, Any],
                 thread_name: str,
                 ) -> tuple[ClientSettings, LoopThread, concurrent.futures.Future[ClientCore]]:
    """Check a client's arguments, start its loop thread and open its core there: the
    settings, the thread, and the core's opening (which fails as `ClientCore.open` does).

    Raises:
        InvalidUrl, InvalidConfiguration, TypeError: bad arguments; no thread was started.
    """
    target = parse_service_url(service_url)
    settings = client_settings(dict(kwargs, broker_config=broker_config))
    thread = LoopThread(thread_name)
    return settings, thread, thread.submit(ClientCore.open(target, settings))


def seek_target(target: Any) -> CodecMessageId | int:
    """A seek's target: a message id (the client's or the codec's) or a publish time in ms.

    Raises:
        InvalidConfiguration: anything else."""
    target = codec_id(target)
    if not isinstance(target, CodecMessageId | int) or isinstance(target, bool):
        raise InvalidConfiguration(f"seek needs a MessageId or a timestamp, not {target!r}")
    return target


async def on_loop(function: Callable[[T], None], argument: T) -> None:
    """Run a plain core method on the loop (the core's state is only touched there)."""
    function(argument)


async def send_and_wait(core: ProducerSet, message: OutMessage) -> MessageId:
    """Send and wait until the broker stored it: its id."""
    return MessageId.wrap(await (await core.send(message)))
