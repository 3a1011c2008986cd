"""Training-side client: report step timings to the trainmon daemon.

Standard library only, so any training environment can import it::

    from trainmon.client import Reporter

Framework callbacks live in ``trainmon.client.lightning`` (PyTorch Lightning)
and ``trainmon.client.transformers`` (Hugging Face ``Trainer``); import them
explicitly, they are not loaded from here.
"""

from __future__ import annotations

from trainmon.client.reporter import Reporter

__all__ = ["Reporter"]
