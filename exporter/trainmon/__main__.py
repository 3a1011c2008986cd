"""``python -m trainmon`` is ``trainmon``."""

from __future__ import annotations

import sys

from trainmon.cli import main

sys.exit(main())
