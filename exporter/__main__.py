"""``python -m exporter`` is ``trainmon``."""

from __future__ import annotations

import sys

from exporter.cli import main

sys.exit(main())
