"""`python -m magnetar.broker.cli`: the `magnetar` command line."""

from ._main import main

raise SystemExit(main())
