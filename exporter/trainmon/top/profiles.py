"""``trainmon top``'s ``p``: an on-demand profile of the job shown, followed on a thread.

The same request as ``trainmon profile JOB`` (``trainmon.runs.profile.ProfileClient``:
the job's lowest rank on the node, the daemon's default steps), asked of the daemon
``top`` reads, with the identity of the user running ``top``: the daemon lets only
the job's owner and root profile it. ``ProfileFollower`` asks and follows the
request on a thread of its own, so the screen never waits on it, and keeps one line
to show: asked, the operators with the most self time, or why not. One profile at
a time; a ``p`` while one runs is ignored.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from trainmon.report.messages import Pair, pick
from trainmon.runs.profile import (
    POLL_SECONDS,
    ProfileClient,
    ProfileRefused,
    ProfileUnreachable,
    unstored_reason,
)
from trainmon.runs.profiles import operators_text

#: How long a profile is followed before ``top`` stops asking (the daemon's own
#: request timeout is 300 s by default; a rank that never answers expires there).
FOLLOW_SECONDS = 330.0

WORDS: Mapping[str, Pair] = {
    "asked": ("profile of {job}: asking…", "{job} 的 profile：请求中…"),
    "running": ("profile of {job}: {steps} step(s) of rank {ranks}…",
                "{job} 的 profile：rank {ranks} 的 {steps} 步…"),
    "stored": ("profile of {job} rank {rank} ({where} self time): {operators}",
               "{job} rank {rank} 的 profile（{where}自身耗时）：{operators}"),
    "no_operators": ("profile of {job} rank {rank}: kept, no operator timed",
                     "{job} rank {rank} 的 profile：已保存，没有算子耗时"),
    "failed": ("profile of {job} rank {rank}: {reason}",
               "{job} rank {rank} 的 profile：{reason}"),
    "refused": ("profile of {job}: {reason}", "{job} 的 profile：{reason}"),
    "unavailable": ("profiles need the node's daemon (top --url or the local one), "
                    "not Prometheus", "profile 需要节点上的守护进程（top --url 或本机），"
                    "不能经 Prometheus"),
    "cpu": ("CPU", "CPU "),
    "device": ("GPU", "GPU "),
}


@dataclass(frozen=True)
class Notice:
    """The line ``top`` shows for the latest profile: its words and its style."""

    key: str
    values: Mapping[str, object]
    #: ``render.STYLES``: ``dim`` while under way, ``ok`` kept, ``bad`` refused or failed.
    style: str

    def text(self, lang: str) -> str:
        values = dict(self.values)
        if "where" in values:
            values["where"] = pick(WORDS[str(values["where"])], lang)
        return pick(WORDS[self.key], lang).format(**values)


class ProfileFollower:
    """Asks the daemon at ``url`` for a job's profile and follows it (module docstring)."""

    def __init__(self, client: ProfileClient, *,
                 clock: Callable[[], float] = time.monotonic,
                 poll_seconds: float = POLL_SECONDS) -> None:
        self._client = client
        self._clock = clock
        self._poll = poll_seconds
        self._lock = threading.Lock()
        self._notice: Notice | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def start(self, job: str) -> bool:
        """Profile ``job``; False while an earlier profile is still followed."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return False
            self._notice = Notice("asked", {"job": job}, "dim")
            self._thread = threading.Thread(target=self._follow, args=(job,),
                                            name="top-profile", daemon=True)
            self._thread.start()
        return True

    def notice(self) -> Notice | None:
        with self._lock:
            return self._notice

    def stop(self) -> None:
        self._stopping.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5.0)

    def _show(self, notice: Notice) -> None:
        with self._lock:
            self._notice = notice

    def _follow(self, job: str) -> None:
        try:
            status = self._client.ask(job)
            self._show(Notice("running", {
                "job": job, "steps": status.get("steps"),
                "ranks": ", ".join(map(str, status.get("ranks") or []))}, "dim"))
            status = self._client.follow(status, until=self._clock() + FOLLOW_SECONDS,
                                         clock=self._clock, wait=self._stopping.wait,
                                         every=self._poll)
            if self._stopping.is_set():
                return
        except ProfileRefused as refused:
            self._show(Notice("refused", {"job": job, "reason": str(refused)}, "bad"))
            return
        except ProfileUnreachable as error:
            self._show(Notice("refused", {"job": job, "reason": str(error)}, "bad"))
            return
        self._show(_outcome(job, status))


def _outcome(job: str, status: Mapping[str, object]) -> Notice:
    """The line for a request that ended (or was given up on): its first rank's."""
    states = status.get("ranks_state")
    if not isinstance(states, Mapping) or not states:
        return Notice("refused", {"job": job, "reason": "no rank answered"}, "bad")
    rank, state = min(states.items(), key=lambda item: int(item[0]))
    state = state if isinstance(state, Mapping) else {}
    what = state.get("state")
    if what == "stored":
        for where, key in (("device", "top_device"), ("cpu", "top_cpu")):
            operators = state.get(key)
            if isinstance(operators, list) and operators:
                return Notice("stored", {"job": job, "rank": rank, "where": where,
                                         "operators": operators_text(operators)}, "ok")
        return Notice("no_operators", {"job": job, "rank": rank}, "ok")
    if what in ("failed", "expired"):
        return Notice("failed", {"job": job, "rank": rank,
                                 "reason": unstored_reason(state)}, "bad")
    return Notice("failed", {"job": job, "rank": rank,
                             "reason": f"no answer after {FOLLOW_SECONDS:.0f} s"}, "bad")
