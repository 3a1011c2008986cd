"""One run id per launched job, with or without a launcher id.

Standard library only: ``torch.distributed`` is used when the program has
imported it, found through ``sys.modules``, never imported here.

``launcher_run_id`` (``trainmon.client.run``) finds the ids that every rank
of a job finds for itself: ``run=``, ``TRAINMON_RUN_ID``, torchrun's
``--rdzv-id``, Slurm's job id. Plain ``torchrun --nproc-per-node 2`` (its
``TORCHELASTIC_RUN_ID`` is ``none``), ``torch.multiprocessing.spawn`` and
hand-set ``RANK`` / ``WORLD_SIZE`` give none, so each process would be a run
of its own; under ``mp.spawn`` no variable names the rank either, and every
process would be rank 0 of 1. ``RunAgreement`` settles one reporter's run id,
rank, local rank and world size:

- **At once** when nothing is left to agree (a launcher id, and a rank and
  world size named by the caller or the environment), when the world size
  named is 1, and when the process shows no sign of belonging to a
  distributed job: no world size named by the environment (one given only
  as ``Reporter(world_size=…)`` is no sign: threads simulating ranks, a
  launcher of the program's own), none of ``DISTRIBUTED_VARIABLES``
  set, not a ``multiprocessing`` child (``multiprocessing.parent_process()``),
  no initialised ``torch.distributed``. Importing ``torch`` imports
  ``torch.distributed``, so that it is imported is no sign. A single process
  sees no delay.
- **Otherwise pending.** The reporter sends nothing meanwhile (its totals
  are cumulative: nothing is lost) and ``poll()`` looks again at
  construction, at ``Reporter.instrument()`` (the training thread; DDP and
  FSDP need an initialised group) and every interval on the sender thread.
  Once ``torch.distributed`` is initialised, rank 0 of the default group
  writes its per-process id into the group's store
  (``distributed_c10d._get_default_store()``) under
  ``trainmon/run/<job>/<TORCHELASTIC_RESTART_COUNT, else 0>`` and keeps it;
  every other rank reads it there, asking ``check()`` first so that no call
  waits on the store (a waiting call would hold the store client's lock that
  the training thread's own store calls need). A group of one keeps its own
  id. What neither the caller nor the environment named comes from the
  group: rank and world size, and the local rank as ``rank %
  LOCAL_WORLD_SIZE`` when that variable is set, else the rank itself (one
  node, as ``mp.spawn`` is mostly used).
- **Bounded.** A reporter still pending ``PENDING_LIMIT_SECONDS`` after its
  construction settles on its own id with one warning; so does any failure
  (the private store accessor gone, a store error, a published id that is no
  run id), which never reaches training. ``close()`` settles (``finish()``)
  after one last look at the store.

Limits: the ranks agree only if rank 0 of the default group runs a reporter
of the same job within the others' bound; a rank that gave up keeps its own
id (an id is never changed once reports went out), and a process group
initialised more than ``PENDING_LIMIT_SECONDS`` after the reporter started
is too late. Two reporters of one job in one process share the key (the last
one rank 0 creates wins). A world size that the environment names is
believed: ``WORLD_SIZE=1`` settles at once, even in a ``multiprocessing``
child.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from trainmon.client.identity import NamedIdentity, RankIdentity, named_identity
from trainmon.training.protocol import sanitize_run_id

log = logging.getLogger(__name__)

#: Longest a reporter waits for the agreement, from its construction, seconds.
PENDING_LIMIT_SECONDS = 120.0
#: Variables that launchers of distributed jobs set (a named world size says more).
DISTRIBUTED_VARIABLES = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
#: Start of the store key under which rank 0 publishes its run id.
STORE_KEY_PREFIX = "trainmon/run"


@dataclass(frozen=True)
class Settlement:
    """The run id and identity a reporter reports under."""

    run: str
    rank: int
    local_rank: int
    world_size: int


def may_be_distributed(
    environ: Mapping[str, str],
    named: NamedIdentity,
    world_size: int,
    modules: Mapping[str, Any],
) -> bool:
    """Whether a process with this environment may be one rank of several that a
    ``torch.distributed`` group will join: a launcher's variables, a
    ``multiprocessing`` child, or an initialised group. A world size given only
    as an argument is not a sign (threads simulating ranks, a launcher of the
    program's own): such a reporter settles at once."""
    if named.world_size and world_size <= 1:
        return False  # a job of one rank, however it was named
    if named_identity(environ).world_size:
        return True  # the launcher's environment names a world of several
    if any(name in environ for name in DISTRIBUTED_VARIABLES):
        return True
    multiprocessing = modules.get("multiprocessing")
    parent_process = getattr(multiprocessing, "parent_process", None)
    if callable(parent_process) and parent_process() is not None:
        return True
    try:
        return _initialised(modules) is not None
    except Exception:  # a broken torch.distributed: not a sign of anything
        return False


def _initialised(modules: Mapping[str, Any]) -> Any:
    """``torch.distributed`` if the program imported it and initialised its default
    group, else None."""
    dist = modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


class RunAgreement:
    """Settles one reporter's run id, rank, local rank and world size (module text).

    ``pending`` is True until it settles; then ``settlement`` holds the values
    and ``on_settle`` has been called with them, once, on the thread that
    settled (before ``pending`` turns False). ``poll()`` and ``finish()`` are
    thread-safe and never raise.
    """

    def __init__(
        self,
        *,
        job: str,
        run: str,
        run_agreed: bool,
        identity: RankIdentity,
        named: NamedIdentity,
        environ: Mapping[str, str],
        on_settle: Callable[[Settlement], None],
        clock: Callable[[], float] = time.monotonic,
        limit_seconds: float = PENDING_LIMIT_SECONDS,
        modules: Mapping[str, Any] | None = None,
    ) -> None:
        self._modules: Mapping[str, Any] = sys.modules if modules is None else modules
        self._own = Settlement(run, identity.rank, identity.local_rank, identity.world_size)
        self._run_agreed = run_agreed
        self._named = named
        self._environ = environ
        self._on_settle = on_settle
        self._clock = clock
        self._limit = limit_seconds
        self._deadline = clock() + limit_seconds
        self._lock = threading.Lock()
        restart = environ.get("TORCHELASTIC_RESTART_COUNT", "").strip() or "0"
        #: The store key rank 0 publishes its run id under.
        self.key = f"{STORE_KEY_PREFIX}/{job}/{restart}"
        #: What it settled on (its own values until then).
        self.settlement = self._own
        # The identity learnt from the group, kept when the run id cannot be agreed.
        self._from_group: Settlement | None = None
        self._waiting_for = "torch.distributed was not initialised"
        agreed = run_agreed and named.rank and named.world_size
        self.pending = not agreed and may_be_distributed(
            environ, named, identity.world_size, self._modules)

    def poll(self, *, wait: bool = True) -> None:
        """Settle if ``torch.distributed`` now says how, or give up past the bound.
        ``wait=False``: return at once when another thread is polling."""
        if not self.pending or not self._lock.acquire(blocking=wait):
            return
        try:
            if self.pending:
                self._poll()
        finally:
            self._lock.release()

    def finish(self, timeout: float | None = None) -> None:
        """Settle now (the reporter closes): one last look, else its own values.
        ``timeout``: the longest to wait for a poll in flight on another thread
        (still pending after it: the caller goes on with the values it has)."""
        if not self.pending or not self._lock.acquire(timeout=-1 if timeout is None
                                                      else timeout):
            return
        try:
            if self.pending:
                self._poll()
            if self.pending:
                self._give_up(f"{self._waiting_for} before the reporter closed")
        finally:
            self._lock.release()

    def _poll(self) -> None:
        try:
            settled = self._agree()
        except Exception as error:  # whatever torch raises must not reach training
            self._give_up(f"{type(error).__name__}: {error}"[:300])
            return
        if settled is not None:
            self._settle(settled)
        elif self._clock() >= self._deadline:
            self._give_up(f"{self._waiting_for} within {self._limit:g} s")

    def _agree(self) -> Settlement | None:
        """The settlement, or None while there is none yet (lock held)."""
        dist = _initialised(self._modules)
        if dist is None:
            return None
        rank, world_size = int(dist.get_rank()), int(dist.get_world_size())
        own, named = self._own, self._named
        reported_rank = own.rank if named.rank else rank
        grouped = Settlement(
            run=own.run,
            rank=reported_rank,
            local_rank=own.local_rank if named.local_rank else self._local_rank(rank),
            world_size=max(own.world_size if named.world_size else world_size,
                           reported_rank + 1),
        )
        self._from_group = grouped
        if self._run_agreed or world_size == 1:
            return grouped
        store = dist.distributed_c10d._get_default_store()
        if rank == 0:
            store.set(self.key, own.run)
            return grouped
        if not store.check([self.key]):
            self._waiting_for = f"rank 0 did not publish its run id (store key {self.key!r})"
            return None
        published = bytes(store.get(self.key)).decode("utf-8", "replace")
        if sanitize_run_id(published) != published:
            raise ValueError(f"rank 0 published {published[:80]!r}, not a run id")
        return replace(grouped, run=published)

    def _local_rank(self, rank: int) -> int:
        """The local rank of group rank ``rank`` when no variable names one."""
        try:
            per_node = int(self._environ.get("LOCAL_WORLD_SIZE", ""))
        except ValueError:
            per_node = 0
        return rank % per_node if per_node > 0 else rank

    def _give_up(self, reason: str) -> None:
        """Settle on this process's own run id (lock held), with the one warning."""
        settled = self._from_group or self._own
        log.warning("trainmon: the ranks did not agree through torch.distributed (%s); this "
                    "process reports as run %r, rank %d of %d (TRAINMON_RUN_ID, the same "
                    "for every rank, names the run without waiting)", reason, settled.run,
                    settled.rank, settled.world_size)
        self._settle(settled)

    def _settle(self, settled: Settlement) -> None:
        self.settlement = settled
        self._on_settle(settled)
        self.pending = False
