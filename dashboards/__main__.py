"""``python -m dashboards [--check] [--out DIR]``: see ``dashboards.generate``."""

from __future__ import annotations

import sys

from dashboards.generate import main

sys.exit(main())
