"""The smallest Hugging Face ``Trainer`` workload: a linear regression and its data.

Imports torch when imported: a test calls ``pytest.importorskip("torch")`` first.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class Regression(torch.nn.Module):  # type: ignore[misc, name-defined]
    """``Linear(8, 1)`` with an MSE loss, in the dict form ``Trainer`` expects;
    ``compute_seconds`` of sleep per forward pass stand in for real compute."""

    def __init__(self, compute_seconds: float = 0.0) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.compute_seconds = compute_seconds

    def forward(self, x: Any, labels: Any) -> dict[str, Any]:
        if self.compute_seconds:
            time.sleep(self.compute_seconds)
        return {"loss": torch.nn.functional.mse_loss(self.layer(x), labels)}


class Pairs(torch.utils.data.Dataset):  # type: ignore[misc, name-defined]
    """``length`` random (x, label) pairs for ``Regression``."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"x": torch.randn(8), "labels": torch.randn(1)}
