"""PyTorch Lightning callback that reports steps to trainmon.

::

    from trainmon.client.lightning import TrainmonCallback
    trainer = Trainer(callbacks=[TrainmonCallback(job="resnet50")])

Uses ``lightning.pytorch`` when installed, else ``pytorch_lightning``; the
class must match the package your ``Trainer`` comes from (with both installed,
``lightning.pytorch`` wins). Imported only when you import this module.

What is measured, and how exactly:

- a **step** is one training batch (``on_train_batch_end``); with gradient
  accumulation that is a micro-batch, not an optimizer step;
- **samples** is the batch's leading dimension, by ``Reporter.step()``'s rule
  (``trainmon.client.batches.samples_in``: ``(x, y)`` counts ``x.shape[0]``, a
  dict its first tensor's; 0 if nothing counts);
- **data wait** is the time from the end of one batch (or the start of the
  epoch) to ``on_train_batch_start`` of the next, minus validation. Lightning
  fetches the batch in that gap, so it is the fetch time plus the host-to-device
  copy, the LR-scheduler update and logger bookkeeping (usually well under a
  millisecond), minus validation and checkpoint saves;
- **validation** runs are a ``validation`` phase;
- **checkpoints**: Lightning has no hook after a save (``on_save_checkpoint``
  runs while the checkpoint dict is being built, before anything is
  written), so from ``on_train_start`` to the end of training the callback
  wraps the trainer's ``save_checkpoint`` (the one call ``ModelCheckpoint``
  and user code save through) in ``Reporter.checkpoint(filepath)``: every
  save counts with its path and duration (state gathering, the write, the
  closing barrier). Every process reports it, since all of them wait for it.

Rank, local rank and world size come from the ``Trainer``; the GPU from the
strategy's root device, mapped through ``CUDA_VISIBLE_DEVICES``.

**Run description** (``framework_settings``): at ``on_train_start`` the
callback adds what the trainer knows to the run's ``framework`` settings:
precision, strategy, accelerator, devices and nodes, epoch and step limits,
gradient accumulation, the train loader's batch size, and the module's (and
datamodule's) ``hparams`` as ``hparams.<name>`` (secret-looking names
redacted like any config key). An exception (``on_exception``) ends the
run ``"ended": "crashed"`` (``"preempted"`` after a SIGTERM: see
``trainmon.client.ending``).

**Communication** (``instrument=True``, the default, with more than one
process): at ``on_train_start`` the model the strategy wrapped
(``trainer.strategy.model``: ``DistributedDataParallel``, FSDP) goes through
``Reporter.instrument`` (see docs/protocol.md, "Measured communication").
DDP takes one communication hook, so a ``DDPStrategy(ddp_comm_hook=...)``
(with its ``ddp_comm_wrapper``) is taken over at ``setup``: the strategy
registers the same hook wrapped in ``timed_comm_hook``, which the
instrumentation then times; the gradients are what the hook alone makes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ImportError:  # the standalone package
    try:
        from pytorch_lightning import (  # type: ignore[assignment, no-redef]
            Callback,
            LightningModule,
            Trainer,
        )
    except ImportError as missing:
        raise ImportError(
            "trainmon.client.lightning needs `lightning` or `pytorch_lightning` installed"
        ) from missing

from trainmon.client.batches import samples_in
from trainmon.client.identity import device_gpu
from trainmon.client.reporter import Reporter

_clock = time.perf_counter
log = logging.getLogger(__name__)


class TrainmonCallback(Callback):
    """Reports every training batch as a step; ``reporter_options`` go to ``Reporter``."""

    def __init__(
        self, job: str | None = None, *, instrument: bool = True, **reporter_options: Any
    ) -> None:
        super().__init__()
        self.job = job
        self.instrument = instrument
        self.reporter_options = reporter_options
        self.reporter: Reporter | None = None
        self._gap_started: float | None = None
        self._excluded = 0.0
        self._validation_started: float | None = None
        self._trainer: Trainer | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Runs before the strategy wraps the model and registers its DDP hook.
        strategy = trainer.strategy
        hook = getattr(strategy, "_ddp_comm_hook", None)
        if self.instrument and hook is not None:
            from trainmon.client.distributed import timed_comm_hook

            wrapper = getattr(strategy, "_ddp_comm_wrapper", None)
            timed = timed_comm_hook(hook if wrapper is None else wrapper(hook))
            strategy._ddp_comm_hook = timed  # type: ignore[attr-defined]
            strategy._ddp_comm_wrapper = None  # type: ignore[attr-defined]

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.reporter is None:
            options = dict(self.reporter_options)
            options.setdefault("gpu", device_gpu(getattr(trainer.strategy, "root_device", None)))
            self.reporter = Reporter(
                self.job, rank=trainer.global_rank, local_rank=trainer.local_rank,
                world_size=trainer.world_size, **options,
            )
            if self.instrument and trainer.world_size > 1:
                self.reporter.instrument(trainer.strategy.model)
            self._time_checkpoints(trainer)
            self.reporter.describe(framework=framework_settings(trainer, pl_module))

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start_gap()

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.reporter is not None and self._gap_started is not None:
            self.reporter.add_data_wait(_clock() - self._gap_started - self._excluded)
        self._gap_started = None

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:
        if self.reporter is not None:
            self.reporter.step(samples=samples_in(batch))
        self._start_gap()

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._validation_started = _clock()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._validation_started is None:
            return
        seconds = _clock() - self._validation_started
        self._validation_started = None
        if self._gap_started is not None:
            self._excluded += seconds
        if self.reporter is not None:
            self.reporter.add_phase("validation", seconds)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._close(finished=True)

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        self._close(finished=False)

    def _time_checkpoints(self, trainer: Trainer) -> None:
        """Wrap ``trainer.save_checkpoint`` (this instance only) in ``Reporter.checkpoint``."""
        if "save_checkpoint" in vars(trainer):
            return  # already wrapped (by this callback or someone else): leave it
        original: Callable[..., None] = trainer.save_checkpoint

        def save_checkpoint(filepath: str | os.PathLike[str], *args: Any, **kwargs: Any) -> None:
            reporter = self.reporter
            if reporter is None:
                return original(filepath, *args, **kwargs)
            started = _clock()
            try:
                with reporter.checkpoint(filepath):
                    original(filepath, *args, **kwargs)
            finally:
                if self._gap_started is not None:
                    self._excluded += _clock() - started  # not data wait
            return None

        trainer.save_checkpoint = save_checkpoint  # type: ignore[method-assign]
        self._trainer = trainer

    def _start_gap(self) -> None:
        self._gap_started = _clock()
        self._excluded = 0.0

    def _close(self, finished: bool) -> None:
        if self._trainer is not None:
            vars(self._trainer).pop("save_checkpoint", None)
            self._trainer = None
        if self.reporter is not None:
            self.reporter.close(finished=finished)
            self.reporter = None


def framework_settings(trainer: Trainer, pl_module: LightningModule) -> dict[str, object]:
    """What the trainer says about the run, for ``Reporter.describe(framework=...)``.

    Each reading is optional (Lightning versions differ); one that fails is
    left out, never raised.
    """
    settings: dict[str, object] = {"name": "lightning"}
    readings: dict[str, Callable[[], object]] = {
        "precision": lambda: str(trainer.precision),
        "strategy": lambda: type(trainer.strategy).__name__,
        "accelerator": lambda: type(trainer.accelerator).__name__,
        "num_devices": lambda: trainer.num_devices,
        "num_nodes": lambda: trainer.num_nodes,
        "max_epochs": lambda: trainer.max_epochs,
        "max_steps": lambda: trainer.max_steps,
        "accumulate_grad_batches": lambda: trainer.accumulate_grad_batches,
        "batch_size": lambda: getattr(trainer.train_dataloader, "batch_size", None),
        "hparams": lambda: dict(pl_module.hparams),
        "datamodule_hparams": lambda: _hparams(getattr(trainer, "datamodule", None)),
    }
    for name, read in readings.items():
        try:
            value = read()
        except Exception as error:  # a Lightning version without it
            log.debug("trainmon: no %s from the trainer: %s", name, error)
            continue
        if value is not None and value != {}:
            settings[name] = value
    return settings


def _hparams(owner: object) -> dict[str, object] | None:
    """``owner.hparams`` as a dict (None without an owner; raises without hparams)."""
    return None if owner is None else dict(owner.hparams)  # type: ignore[attr-defined]
