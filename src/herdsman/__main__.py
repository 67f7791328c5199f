"""Allow ``python -m herdsman``."""

from herdsman.cli import main

raise SystemExit(main())
