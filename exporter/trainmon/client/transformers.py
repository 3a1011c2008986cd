"""Hugging Face ``Trainer`` callback that reports steps to trainmon.

::

    from trainmon.client.transformers import TrainmonCallback
    trainer = Trainer(..., callbacks=[TrainmonCallback(job="llama-sft")])

Imported only when you import this module (needs ``transformers``).

What is measured, and how exactly:

- a **step** is one optimizer step (``on_step_end``), i.e. all
  ``gradient_accumulation_steps`` micro-batches;
- **samples** is ``per_device_train_batch_size × gradient_accumulation_steps``
  (the configured size: a short last batch is over-counted);
- **data wait** is the time from the previous known event (end of the last
  step, of logging, evaluation or checkpointing; or the start of training) to
  ``on_step_begin``. ``Trainer`` fetches all micro-batches of a step
  (``get_batch_samples``) right before ``on_step_begin``, so this is the fetch
  time plus the host-to-device copy of those batches;
- **evaluation** and **checkpoint** are phases, measured from the previous
  event to ``on_evaluate`` / ``on_save`` (Trainer offers no hook at their start;
  the logging in between is sub-millisecond);
- each ``on_save`` is also a **checkpoint** (``Reporter.checkpoint_saved``) of
  that duration, saved to ``args.output_dir/checkpoint-<global step>``, the
  folder ``Trainer`` writes (every process reports it: all of them wait for
  the save, and with FSDP or DeepSpeed all of them write).

Rank, local rank and world size come from ``TrainingArguments``
(``process_index``, ``local_process_index``, ``world_size``); the GPU from
``args.device``, mapped through ``CUDA_VISIBLE_DEVICES``.

**Run description** (``framework_settings``): at ``on_train_begin`` the
callback adds the ``TrainingArguments`` that shape throughput to the run's
``framework`` settings: batch size (per device × accumulation) and its parts,
precision (``bf16`` / ``fp16`` / ``fp32``, ``tf32``), learning rate and
schedule, optimizer, epochs and steps, seed, gradient checkpointing,
``torch_compile``, loader workers, FSDP and DeepSpeed, and the model's
``model_type`` and name. Never the whole ``TrainingArguments``: it holds
``hub_token`` and similar, which are redacted anyway.

**Communication** (``instrument=True``, the default, with more than one
process): at ``on_train_begin`` the model ``Trainer`` wrapped
(``trainer.model_wrapped``: ``DistributedDataParallel`` from accelerate, FSDP)
goes through ``Reporter.instrument`` (docs/protocol.md, "Measured
communication"). Callbacks are handed only the unwrapped model, so the
callback finds the ``Trainer`` that calls it on the call stack (the caller
whose ``callback_handler`` holds this callback) and reads its
``model_wrapped``. A hook set through accelerate's
``DistributedDataParallelKwargs(comm_hook=...)`` is registered before any
callback runs; DDP takes only one, so such a job is left unmeasured (a
warning says so).
"""

from __future__ import annotations

import os
import sys
import time
from types import FrameType
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from trainmon.client.identity import device_gpu
from trainmon.client.reporter import Reporter

_clock = time.perf_counter
#: ``transformers.trainer_utils.PREFIX_CHECKPOINT_DIR``: Trainer saves to
#: ``<output_dir>/checkpoint-<global step>``.
CHECKPOINT_PREFIX = "checkpoint"
#: How far up the call stack ``on_train_begin`` looks for its ``Trainer``.
MAX_CALLER_FRAMES = 8


class TrainmonCallback(TrainerCallback):
    """Reports every optimizer step; ``reporter_options`` go to ``Reporter``."""

    def __init__(
        self, job: str | None = None, *, instrument: bool = True, **reporter_options: Any
    ) -> None:
        self.job = job
        self.instrument = instrument
        self.reporter_options = reporter_options
        self.reporter: Reporter | None = None
        self._last_event = _clock()

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        if self.reporter is None:
            options = dict(self.reporter_options)
            options.setdefault("gpu", device_gpu(getattr(args, "device", None)))
            self.reporter = Reporter(
                self.job, rank=args.process_index, local_rank=max(args.local_process_index, 0),
                world_size=args.world_size, **options,
            )
            if self.instrument and args.world_size > 1:
                self.reporter.instrument(self._wrapped_model(kwargs.get("model")))
            self.reporter.describe(framework=framework_settings(args, kwargs.get("model")))
        self._last_event = _clock()

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        if self.reporter is not None:
            self.reporter.add_data_wait(_clock() - self._last_event)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        if self.reporter is not None:
            samples = args.per_device_train_batch_size * args.gradient_accumulation_steps
            self.reporter.step(samples=samples)
        self._last_event = _clock()

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        self._last_event = _clock()

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        self._phase_ended("evaluation")

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        now = _clock()
        if self.reporter is not None:
            folder = f"{CHECKPOINT_PREFIX}-{state.global_step}"
            path = os.path.join(args.output_dir, folder) if args.output_dir else None
            self.reporter.checkpoint_saved(path, now - self._last_event)
        self._last_event = now

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        if self.reporter is not None:
            self.reporter.close()
            self.reporter = None

    def _wrapped_model(self, model: object) -> object:
        """``model_wrapped`` of the ``Trainer`` calling this callback, else ``model``."""
        frame: FrameType | None = sys._getframe(1)
        for _ in range(MAX_CALLER_FRAMES):
            if frame is None:
                break
            caller = frame.f_locals.get("self")
            handler = getattr(caller, "callback_handler", None)
            if any(callback is self for callback in getattr(handler, "callbacks", ())):
                return getattr(caller, "model_wrapped", model)
            frame = frame.f_back
        return model

    def _phase_ended(self, name: str) -> None:
        now = _clock()
        if self.reporter is not None:
            self.reporter.add_phase(name, now - self._last_event)
        self._last_event = now


#: ``TrainingArguments`` fields recorded in the run description, as they are.
TRAINING_ARGUMENTS: tuple[str, ...] = (
    "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate",
    "lr_scheduler_type", "warmup_steps", "weight_decay", "optim", "num_train_epochs",
    "max_steps", "seed", "tf32", "gradient_checkpointing", "torch_compile",
    "dataloader_num_workers", "dataloader_pin_memory", "fsdp", "ddp_backend",
)


def framework_settings(args: TrainingArguments, model: object) -> dict[str, object]:
    """What ``args`` and ``model`` say about the run, for ``Reporter.describe(framework=...)``."""
    settings: dict[str, object] = {"name": "transformers"}
    for name in TRAINING_ARGUMENTS:
        value = getattr(args, name, None)
        if value is not None:
            settings[name] = value if isinstance(value, (bool, int, float, str)) else str(value)
    per_device = getattr(args, "per_device_train_batch_size", None)
    accumulation = getattr(args, "gradient_accumulation_steps", None)
    if isinstance(per_device, int) and isinstance(accumulation, int):
        settings["batch_size"] = per_device * accumulation
    settings["precision"] = (
        "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False)
        else "fp32"
    )
    settings["deepspeed"] = bool(getattr(args, "deepspeed", None))
    config = getattr(model, "config", None)
    for key, attribute in (("model_type", "model_type"), ("model_name", "_name_or_path")):
        value = getattr(config, attribute, None)
        if isinstance(value, str) and value:
            settings[key] = value
    return settings
