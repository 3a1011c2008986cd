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
