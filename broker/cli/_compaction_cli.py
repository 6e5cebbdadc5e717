"""`magnetar topics compact TOPIC` and `magnetar topics compaction-status TOPIC [-w]`, as
`pulsar-admin topics compact|compaction-status` (the admin API's `PUT|GET .../compaction`).
`compaction-status -w` polls until the compaction is no longer RUNNING, every
`STATUS_POLL_INTERVAL_S`, and exits 1 when it ended in ERROR."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from ._admin_http import _command, _http_security, _topic_path, admin_request

if TYPE_CHECKING:
    from ._admin_http import SubParsers

__all__ = ["add_compaction_commands"]

STATUS_POLL_INTERVAL_S = 0.5


def _compact(args: argparse.Namespace) -> int:
    admin_request(args.admin_url, "PUT", f"{_topic_path(args.topic)}/compaction",
                  **_http_security(args))
    print(f"Topic compaction requested for {args.topic}")
    return 0


def _status(args: argparse.Namespace) -> int:
    while True:
        answer = admin_request(args.admin_url, "GET", f"{_topic_path(args.topic)}/compaction",
                               **_http_security(args))
        status = answer.get("status", "") if isinstance(answer, dict) else ""
        if not (args.wait_complete and status == "RUNNING"):
            break
        time.sleep(STATUS_POLL_INTERVAL_S)
    error = answer.get("lastError") if isinstance(answer, dict) else ""
    print(f"Compaction status of {args.topic}: {status}" + (f" ({error})" if error else ""))
    return 1 if status == "ERROR" else 0


def add_compaction_commands(commands: SubParsers) -> None:
    """Register `compact` and `compaction-status` under `magnetar topics`."""
    _command(commands, "compact", "compact a topic (in the background: see "
             "compaction-status)", _compact).add_argument("topic")
    status = _command(commands, "compaction-status", "show the status of a topic's last "
                      "compaction", _status)
    status.add_argument("topic")
    status.add_argument("-w", "--wait-complete", action="store_true",
                        help="wait until it is no longer running")
