"""Test-wide settings.

Hypothesis explores new examples on every developer run; under CI (``CI`` set)
it is derandomised, so a red CI run is reproducible from the same commit.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
