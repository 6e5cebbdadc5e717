"""`python -m broker.cli`: the `magnetar` command line."""

from ._main import main

raise SystemExit(main())
