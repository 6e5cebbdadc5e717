"""The `magnetar` command line: main, the standalone bootstrap, admin, schema and token commands."""

from ._main import build_parser, main

__all__ = ["build_parser", "main"]
