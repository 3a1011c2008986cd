"""How a run ended: the ``ended`` of a reporter's last run description.

Standard library only. ``Reporter`` keeps one ``ProcessEnding`` per process;
each reporter registers with it (``watch()``) and its ``track()`` names the
thread that drives it (``drives()``). The reasons
(``trainmon.training.protocol.RUN_END_REASONS``) and what gives each one:

- ``finished``: ``close()``, leaving ``with Reporter()`` normally (or by
  ``sys.exit(0)``), and the interpreter's exit with a reporter left open
  (``atexit``) when nothing below happened.
- ``crashed``: an exception ended the process, or the thread that drives the
  reporter, or the caller said so (``close(finished=False)``, leaving
  ``with Reporter()`` on an exception other than ``SystemExit(0)``):

  * ``sys.excepthook`` is wrapped (the previous hook still runs): an
    uncaught exception of the main thread marks the process crashed, and
    the reporters still open at exit close ``crashed``. Not in an
    interactive session, where the prompt comes back; ``sys.last_value``
    at exit stands in for a hook someone replaced without chaining ours.
  * ``threading.excepthook`` is wrapped likewise: an uncaught exception
    (not ``SystemExit``) in the thread that created a reporter, or that last
    called its ``track()``, closes that reporter ``crashed`` at once (the
    process may go on). Other threads dying close nothing.
  * a ``multiprocessing`` child (``torch.multiprocessing.spawn`` workers,
    ``Process``): no excepthook runs there. ``mp.spawn`` catches the
    worker's exception, hands it to the parent and calls ``sys.exit(1)``;
    ``Process`` prints it and exits 1. At the first reporter of a child,
    a ``multiprocessing.util.Finalize`` callback is registered and the frame
    of ``BaseProcess._bootstrap`` (which runs the child) is kept. The
    callback runs in ``_bootstrap``'s ``finally`` before Python 3.13, where
    ``sys.exc_info()`` is the exception passing through (``SystemExit(1)``
    whose ``__context__`` is the error, for ``mp.spawn``), and at exit from
    3.13 on, after ``_bootstrap`` computed ``exitcode`` in that frame. An
    exception other than ``SystemExit(0)``, or a non-zero exit code, is a
    crash; the reporters still open close with it.
- ``preempted``: SIGTERM, from a scheduler, a spot reclaim, ``docker stop``,
  torchrun stopping its workers. ``watch()`` and ``drives()`` on the main
  thread look at SIGTERM's disposition: the default (``SIG_DFL``) is
  replaced by a stand-in that closes the open reporters ``preempted``
  (concurrently, in threads, within ``close_timeout`` in all), then restores
  ``SIG_DFL`` and sends SIGTERM to the process again, so it still dies by
  SIGTERM (exit status 143, ``returncode == -15``); a Python handler of the
  user's is wrapped: the process is marked preempted and their handler
  runs (it decides what happens next; every later ``close()`` says
  ``preempted``); ``SIG_IGN`` and handlers not set from Python are left
  alone. A handler installed over ours later is wrapped at the next
  ``track()``; one that chains to ours (Lightning's does) makes ours only
  mark the process. A Python handler runs only when the main thread
  executes Python code, and a main thread blocked in C (a collective
  waiting for a dead peer) would hold it back: so a watcher thread also
  reads ``signal.set_wakeup_fd`` (when no one else uses it, asyncio for
  one), where the C-level handler writes each signal's number as it
  arrives, and does the same from there (restoring ``SIG_DFL`` through
  ``PyOS_setsig``, since ``signal.signal`` works only on the main thread).
- ``SIGKILL``, ``os._exit``, a lost machine: nothing is sent; the daemon
  concludes the run ``lost`` from the silence.

Once a process is marked preempted, every ``close()`` ends ``preempted``;
the crash mark counts only for the reporters closed at exit. After
``fork()`` the child starts with no open reporters, no marks, the SIGTERM
disposition and the wakeup fd it had before ours (a forked DataLoader
worker never closes the parent's reporters or wakes its watcher).

Limits: a worker that ``mp.spawn`` stops by SIGINT (``PR_SET_PDEATHSIG``
when its parent dies, Ctrl-C) swallows the ``KeyboardInterrupt``, exits 0
and says ``finished``: signal the workers too (Slurm and torchrun do). An
uncaught ``KeyboardInterrupt`` in the main thread is an exception like any
other: ``crashed``.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, Protocol

log = logging.getLogger(__name__)

#: ``multiprocessing.util.Finalize`` priority of the child's exit callback
#: (higher runs earlier; the pool and queue finalizers use 10 and below).
FINALIZER_PRIORITY = 100
#: Seconds waited past ``close_timeout`` for the closing threads to return.
JOIN_SLACK_SECONDS = 0.5

SignalHandler = Callable[[int, FrameType | None], Any]

#: Per forking thread: whether ``_before_fork`` blocked SIGTERM (to unblock after).
_forking = threading.local()


class Closable(Protocol):
    """What ``ProcessEnding`` needs of a reporter."""

    def close(self, finished: bool = True, *, ended: str | None = None) -> None: ...


class ProcessEnding:
    """Tells a process's reporters how it ended (module docstring); one per process."""

    def __init__(self, close_timeout: float) -> None:
        self._close_timeout = close_timeout
        self._reset()
        self._hooked_exit = False

    def _reset(self) -> None:
        # Reentrant: a signal handler may run on the main thread while it holds it.
        self._lock = threading.RLock()
        # reporter -> ident of the thread that drives it
        self._open: weakref.WeakKeyDictionary[Closable, int] = weakref.WeakKeyDictionary()
        self._pid: int | None = None  # the process the hooks below were set up in
        self._crashed = False
        self._preempted = False
        self._terminating = False
        self._terminated = threading.Event()
        self._bootstrap: FrameType | None = None  # a multiprocessing child's _bootstrap
        self._wakeup: tuple[int, int] | None = None  # the watcher's pipe (read, write)

    # -- what reporters call ---------------------------------------------------

    def watch(self, reporter: Closable) -> None:
        """Register a new reporter, driven by the calling thread; set the hooks up."""
        with self._lock:
            self._open[reporter] = threading.get_ident()
            first = self._pid != os.getpid()
            self._pid = os.getpid()
        if first:
            self._set_up_process()
        self._hook_exceptions()
        self._hook_sigterm()

    def drives(self, reporter: Closable) -> None:
        """The calling thread drives ``reporter`` from now on (``track()``)."""
        with self._lock:
            if reporter in self._open:
                self._open[reporter] = threading.get_ident()
        self._hook_exceptions()
        self._hook_sigterm()

    def forget(self, reporter: Closable) -> None:
        """``reporter`` is closed."""
        with self._lock:
            self._open.pop(reporter, None)

    def reason(self, requested: str) -> str:
        """The ``ended`` to send for a ``close()`` that asked for ``requested``."""
        return "preempted" if self._preempted else requested

    # -- set-up ----------------------------------------------------------------

    def _set_up_process(self) -> None:
        """Once per process: the exit hooks, and a multiprocessing child's callback."""
        if not self._hooked_exit:
            self._hooked_exit = True
            atexit.register(self._close_at_exit)
            if hasattr(os, "register_at_fork"):
                os.register_at_fork(before=self._before_fork,
                                    after_in_parent=self._unblock_after_fork,
                                    after_in_child=self._after_fork_in_child)
        processes = sys.modules.get("multiprocessing.process")
        if processes is None or processes.parent_process() is None:
            return
        self._bootstrap = _running_frame(processes.BaseProcess._bootstrap.__code__)
        from multiprocessing import util

        util.Finalize(None, self._close_at_exit, exitpriority=FINALIZER_PRIORITY)

    def _hook_exceptions(self) -> None:
        if not isinstance(sys.excepthook, _ProcessExceptHook):
            sys.excepthook = _ProcessExceptHook(self, sys.excepthook)
        if not isinstance(threading.excepthook, _ThreadExceptHook):
            threading.excepthook = _ThreadExceptHook(self, threading.excepthook)

    def _hook_sigterm(self) -> None:
        """On the main thread: take SIGTERM's default action over, or wrap a Python handler."""
        if threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGTERM)
        if isinstance(current, (_SigtermStandIn, _SigtermChain)):
            return
        if current == signal.SIG_DFL:
            handler: SignalHandler = _SigtermStandIn(self)
        elif callable(current):
            handler = _SigtermChain(self, current)
        else:  # SIG_IGN, or a handler not set from Python: not ours to touch
            return
        signal.signal(signal.SIGTERM, handler)
        self._watch_wakeups()

    def _watch_wakeups(self) -> None:
        """Start the watcher of the signal wakeup fd, unless someone else uses it."""
        if self._wakeup is not None:
            return
        read, write = os.pipe()
        os.set_blocking(write, False)
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        if previous != -1:  # asyncio's, say: theirs stays, the Python handler suffices
            signal.set_wakeup_fd(previous)
            os.close(read)
            os.close(write)
            return
        self._wakeup = (read, write)
        threading.Thread(target=self._read_wakeups, args=(read,), daemon=True,
                         name="trainmon-sigterm").start()

    def _before_fork(self) -> None:
        """SIGTERM waits while the forking thread forks: a child signalled before its
        ``_after_fork_in_child`` ran would write to the parent's wakeup pipe."""
        if self._wakeup is not None:
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            _forking.unblock = signal.SIGTERM not in blocked

    def _unblock_after_fork(self) -> None:
        if getattr(_forking, "unblock", False):
            _forking.unblock = False
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    def _after_fork_in_child(self) -> None:
        """A forked child has none of the parent's reporters, marks or watcher."""
        wakeup = self._wakeup
        try:
            handler = signal.getsignal(signal.SIGTERM)
            if isinstance(handler, _SigtermChain):
                signal.signal(signal.SIGTERM, handler.previous)
            elif isinstance(handler, _SigtermStandIn):
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if wakeup is not None:
                current = signal.set_wakeup_fd(-1)
                if current != wakeup[1]:
                    signal.set_wakeup_fd(current)
                else:
                    os.close(wakeup[0])
                    os.close(wakeup[1])
        except (ValueError, OSError) as error:  # not the main thread: leave them
            log.debug("trainmon: cannot reset signal handling after fork (%s)", error)
        finally:
            self._reset()
            self._unblock_after_fork()  # a SIGTERM that came meanwhile: the default now

    # -- how the process ends ----------------------------------------------------

    def _exit_reason(self) -> str:
        """How the process ends, as seen at exit (or by a child's finalizer)."""
        if self._bootstrap is not None:  # a multiprocessing child
            error = sys.exc_info()[1]
            if error is not None:
                clean = isinstance(error, SystemExit) and error.code in (0, None)
                return "finished" if clean else "crashed"
            code = self._bootstrap.f_locals.get("exitcode", 0)
            return "crashed" if self._crashed or code != 0 else "finished"
        if self._crashed or (not _interactive() and getattr(sys, "last_value", None)):
            return "crashed"
        return "finished"

    def _close_at_exit(self) -> None:
        """Close the reporters still open (``atexit``; a child's finalizer)."""
        if self._pid != os.getpid():
            return
        ended = self._exit_reason()
        for reporter in self._reporters():
            _close(reporter, ended)

    def _reporters(self, thread: int | None = None) -> list[Closable]:
        with self._lock:
            return [reporter for reporter, driver in list(self._open.items())
                    if thread is None or driver == thread]

    def _excepting(self) -> None:
        """``sys.excepthook`` runs: the main thread ends on an exception."""
        if not _interactive():
            self._crashed = True

    def _thread_died(self, args: threading.ExceptHookArgs) -> None:
        """``threading.excepthook`` runs: close the reporters that thread drove."""
        thread = args.thread
        if thread is None or thread.ident is None or issubclass(args.exc_type, SystemExit):
            return
        for reporter in self._reporters(thread.ident):
            _close(reporter, "crashed")

    def _sigterm(self, stand_in: bool) -> None:
        """SIGTERM arrived. Mark the process; if it is ours to act on
        (``stand_in``: SIG_DFL's stand-in is installed), close the reporters
        within the bound and die by SIGTERM. Any thread, any number of times."""
        self._preempted = True
        if not stand_in:
            return
        with self._lock:
            first, self._terminating = not self._terminating, True
        if first:
            _close_concurrently(self._reporters(), "preempted",
                                self._close_timeout + JOIN_SLACK_SECONDS)
            self._terminated.set()
        else:
            self._terminated.wait(self._close_timeout + JOIN_SLACK_SECONDS)
        _die_by_sigterm()

    def _read_wakeups(self, read: int) -> None:
        """The watcher thread: act on SIGTERM as soon as the C-level handler reports it."""
        while True:
            try:
                numbers = os.read(read, 512)
            except OSError:
                return
            if not numbers:
                return
            if signal.SIGTERM in numbers:
                handler = signal.getsignal(signal.SIGTERM)
                self._sigterm(stand_in=isinstance(handler, _SigtermStandIn))


class _SigtermStandIn:
    """SIGTERM's default action, with the reporters closed first."""

    def __init__(self, ending: ProcessEnding) -> None:
        self._ending = ending

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        # Called by a handler that chains to us (then only the mark counts)?
        ours = signal.getsignal(signal.SIGTERM) is self
        self._ending._sigterm(stand_in=ours)


class _SigtermChain:
    """A user's SIGTERM handler, run after the process is marked preempted."""

    def __init__(self, ending: ProcessEnding, previous: SignalHandler) -> None:
        self._ending = ending
        self.previous = previous

    def __call__(self, signum: int, frame: FrameType | None) -> Any:
        self._ending._sigterm(stand_in=False)
        return self.previous(signum, frame)


class _ProcessExceptHook:
    """``sys.excepthook``: mark the crash, then the previous hook."""

    def __init__(self, ending: ProcessEnding, previous: Callable[..., Any]) -> None:
        self._ending = ending
        self._previous = previous

    def __call__(self, *exc_info: Any) -> Any:
        self._ending._excepting()
        return self._previous(*exc_info)


class _ThreadExceptHook:
    """``threading.excepthook``: the previous hook, then close what the thread drove."""

    def __init__(self, ending: ProcessEnding,
                 previous: Callable[[threading.ExceptHookArgs], Any]) -> None:
        self._ending = ending
        self._previous = previous

    def __call__(self, args: threading.ExceptHookArgs) -> Any:
        try:
            return self._previous(args)
        finally:
            self._ending._thread_died(args)


def _close(reporter: Closable, ended: str) -> None:
    try:
        reporter.close(ended=ended)
    except Exception:  # one reporter's failure must not keep the others open
        log.warning("trainmon: cannot close a reporter (%s)", ended, exc_info=True)


def _close_concurrently(reporters: Iterable[Closable], ended: str, timeout: float) -> None:
    """Close ``reporters`` in threads of their own, waiting ``timeout`` in all.

    Threads: a signal handler may have interrupted the main thread inside a
    reporter's lock, which a close in the same thread would wait for forever.
    """
    threads = [threading.Thread(target=_close, args=(reporter, ended), daemon=True,
                                name="trainmon-close") for reporter in reporters]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def _die_by_sigterm() -> None:
    """Restore SIGTERM's default action and send it to this process."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    elif not _default_sigterm_from_any_thread():
        return  # the main thread's handler finishes the job when it runs
    os.kill(os.getpid(), signal.SIGTERM)


def _default_sigterm_from_any_thread() -> bool:
    """``signal.signal(SIGTERM, SIG_DFL)`` from a thread that is not the main one,
    through CPython's ``PyOS_setsig``; False where that cannot be done."""
    try:
        import ctypes

        setsig = ctypes.pythonapi.PyOS_setsig
    except (ImportError, AttributeError):  # not CPython
        return False
    setsig.argtypes = (ctypes.c_int, ctypes.c_void_p)
    setsig.restype = ctypes.c_void_p
    setsig(signal.SIGTERM, None)  # SIG_DFL is the null handler
    return True


def _running_frame(code: object) -> FrameType | None:
    """The frame executing ``code`` on this thread's stack, else on the main thread's."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    if frame is None:
        frame = sys._current_frames().get(threading.main_thread().ident or 0)
        while frame is not None and frame.f_code is not code:
            frame = frame.f_back
    return frame


def _interactive() -> bool:
    """An interactive session, where an uncaught exception returns to the prompt."""
    return hasattr(sys, "ps1") or bool(sys.flags.interactive)
