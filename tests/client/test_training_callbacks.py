"""Framework callbacks on real frameworks (skipped where the framework is not installed):
a PyTorch Lightning Trainer and a Hugging Face Trainer, CPU only, reporting to a receiver."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testkit.exposition import Scrape, scrape
from trainmon.client.identity import device_gpu
from trainmon.collectors.training import TrainingCollector

torch = pytest.importorskip("torch")

Make = Callable[..., TrainingCollector]
ITEM_SLEEP_SECONDS = 0.004
COMPUTE_SLEEP_SECONDS = 0.012
BATCH_SIZE = 4


class SlowDataset(torch.utils.data.Dataset):  # type: ignore[misc, name-defined]
    def __init__(self, size: int, as_dict: bool = False) -> None:
        self.size = size
        self.as_dict = as_dict
        self.load_seconds = 0.0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Any:
        started = time.perf_counter()
        time.sleep(ITEM_SLEEP_SECONDS)
        generator = torch.Generator().manual_seed(index)
        x, y = torch.randn(8, generator=generator), torch.randn(1, generator=generator)
        self.load_seconds += time.perf_counter() - started
        return {"x": x, "labels": y} if self.as_dict else (x, y)


def wait_for_steps(collector: TrainingCollector, job: str, steps: int) -> Scrape:
    deadline = time.monotonic() + 10
    while True:
        result = scrape(collector)
        if result.value("trainmon_training_steps_total", job=job, rank="0") == steps:
            return result
        assert time.monotonic() < deadline, result.text
        time.sleep(0.05)


def test_lightning_callback(make_collector: Make, socket_path: Path, tmp_path: Path) -> None:
    lightning = pytest.importorskip("lightning.pytorch")
    from trainmon.client.lightning import TrainmonCallback

    class Regression(lightning.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            time.sleep(COMPUTE_SLEEP_SECONDS)
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            time.sleep(0.05)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    collector = make_collector(socket=socket_path)
    dataset = SlowDataset(30 * BATCH_SIZE)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH_SIZE)
    validation = torch.utils.data.DataLoader(SlowDataset(2 * BATCH_SIZE), batch_size=BATCH_SIZE)
    callback = TrainmonCallback("lightning-job", endpoint=f"unix://{socket_path}")
    trainer = lightning.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, callbacks=[callback], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        val_check_interval=15, num_sanity_val_steps=0, default_root_dir=tmp_path,
    )
    started = time.perf_counter()
    trainer.fit(Regression(), loader, validation)
    elapsed = time.perf_counter() - started
    result = wait_for_steps(collector, "lightning-job", 30)
    rank = {"job": "lightning-job", "rank": "0"}
    assert result.value("trainmon_training_samples_total", **rank) == 30 * BATCH_SIZE
    wait = result.value("trainmon_training_data_wait_seconds_total", **rank)
    assert wait is not None
    # Fetch time plus Lightning's small bookkeeping between the hooks; never the validation.
    assert dataset.load_seconds <= wait <= dataset.load_seconds + 0.02 * 30
    validation_seconds = result.value("trainmon_training_phase_seconds_total",
                                      phase="validation", **rank)
    assert validation_seconds is not None and 0.2 <= validation_seconds < elapsed
    assert result.labelsets("trainmon_training_rank_info")[0]["gpu"] == ""


def test_transformers_callback(make_collector: Make, socket_path: Path, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from testkit.tiny_trainer import Regression
    from trainmon.client.transformers import TrainmonCallback

    collector = make_collector(socket=socket_path)
    dataset = SlowDataset(20 * 2 * BATCH_SIZE, as_dict=True)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=BATCH_SIZE,
        gradient_accumulation_steps=2, max_steps=20, report_to=[], use_cpu=True,
        save_strategy="no", logging_strategy="no", dataloader_num_workers=0,
        disable_tqdm=True,
    )
    callback = TrainmonCallback("hf-job", endpoint=f"unix://{socket_path}")
    trainer = transformers.Trainer(model=Regression(COMPUTE_SLEEP_SECONDS), args=args,
                                   train_dataset=dataset, callbacks=[callback])
    trainer.train()
    result = wait_for_steps(collector, "hf-job", 20)
    rank = {"job": "hf-job", "rank": "0"}
    assert result.value("trainmon_training_samples_total", **rank) == 20 * 2 * BATCH_SIZE
    wait = result.value("trainmon_training_data_wait_seconds_total", **rank)
    assert wait is not None
    assert dataset.load_seconds <= wait <= dataset.load_seconds + 0.02 * 20


@pytest.mark.parametrize(
    ("device", "visible", "gpu"),
    [
        ("cuda:1", None, "1"),
        ("cuda", None, "0"),
        ("cuda:1", "4,5", "5"),
        ("cuda:0", "GPU-8f2c1a", None),  # UUIDs need NVML
        ("cpu", None, None),
        ("meta", "4,5", None),
    ],
)
def test_callbacks_map_the_torch_device_to_the_nvml_index(
    device: str, visible: str | None, gpu: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert device_gpu(torch.device(device)) == gpu
    assert device_gpu(None) is None
