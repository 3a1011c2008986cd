"""``trainmon profile JOB [--rank N | --all] [--steps K]``: profile a running job.

The command of ``trainmon.profiling`` (the daemon's side); beside the ledger's
other commands, whose words for a profile it shares (``trainmon.runs.profiles``).

Asks the daemon (``POST /api/v1/profile``: ``trainmon.profiling.service``), then
follows the request (``GET /api/v1/profile?id=…``, every ``POLL_SECONDS``) until
every rank asked has answered or the request expired, and prints, per rank, where
its trace was kept and the operators with the most self time (``--json``: the
request's status as the daemon answers it). Exit 0 when every rank's trace was
kept, 1 when one failed or never answered (or the daemon cannot be read), 2 when
the daemon refused the request (another user's job: 403).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

import requests

from trainmon.profiling.service import PROFILE_PATH
from trainmon.runs.profiles import operators_text

#: Seconds between two looks at the request's status.
POLL_SECONDS = 0.5
#: Seconds one HTTP exchange with the daemon may take.
HTTP_TIMEOUT_SECONDS = 10.0
EXIT_OK, EXIT_INCOMPLETE, EXIT_REFUSED = 0, 1, 2


class ProfileRefused(Exception):
    """The daemon answered the request with ``status_code`` (403, 404, 409, 429, 400 …)."""

    def __init__(self, status_code: int, detail: object) -> None:
        super().__init__(f"refused: {detail} (HTTP {status_code})")
        self.status_code = status_code


class ProfileUnreachable(Exception):
    """The daemon could not be asked, or its answer read."""


class ProfileClient:
    """``POST`` and ``GET /api/v1/profile`` of the daemon at ``url``."""

    def __init__(self, url: str, session: requests.Session | None = None) -> None:
        self.url = url
        self.target = url.rstrip("/") + PROFILE_PATH
        self._http = session or requests.Session()

    def ask(self, job: str, *, ranks: Sequence[int] | str | None = None,
            steps: int | None = None) -> dict[str, Any]:
        """The new request's status (202); raises ``ProfileRefused``,
        ``ProfileUnreachable``."""
        body: dict[str, object] = {"job": job, "ranks": list(ranks) if isinstance(
            ranks, (list, tuple)) else ranks}
        if steps is not None:
            body["steps"] = steps
        try:
            answer = self._http.post(self.target, json=body, timeout=HTTP_TIMEOUT_SECONDS)
            status = answer.json()
        except (requests.RequestException, ValueError) as error:
            raise ProfileUnreachable(f"cannot ask {self.url}: {error}") from error
        if answer.status_code != 202 or not isinstance(status, dict):
            detail = status.get("detail", status) if isinstance(status, dict) else status
            raise ProfileRefused(answer.status_code, detail)
        return status

    def status(self, request_id: str) -> dict[str, Any]:
        """The request's status now; raises ``ProfileUnreachable``."""
        try:
            followed = self._http.get(self.target, params={"id": request_id},
                                      timeout=HTTP_TIMEOUT_SECONDS)
            followed.raise_for_status()
            status = followed.json()
        except (requests.RequestException, ValueError) as error:
            raise ProfileUnreachable(f"cannot follow request {request_id}: {error}") \
                from error
        if not isinstance(status, dict):
            raise ProfileUnreachable(f"request {request_id}: not a status: {status!r}")
        return status

    def follow(self, status: dict[str, Any], *, until: float, clock: Callable[[], float],
               wait: Callable[[float], bool], every: float = POLL_SECONDS) -> dict[str, Any]:
        """The request of ``status`` (``ask``'s answer) looked at every ``every`` seconds
        (``wait``, True to stop early) until it closes or ``clock()`` reaches ``until``;
        its last status. Raises ``ProfileUnreachable``."""
        while status.get("open") and clock() < until:
            if wait(every):
                break
            status = self.status(str(status["id"]))
        return status


def profile_command(
    url: str,
    job: str,
    *,
    ranks: Sequence[int] | str | None,
    steps: int | None,
    wait_seconds: float,
    as_json: bool,
    out: TextIO,
    err: TextIO,
    session: requests.Session | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Ask for the profile, follow it, print it; the exit code (module docstring)."""
    import json

    client = ProfileClient(url, session)
    try:
        status = client.ask(job, ranks=ranks, steps=steps)
    except ProfileUnreachable as error:
        print(f"trainmon profile: {error}", file=err)
        return EXIT_INCOMPLETE
    except ProfileRefused as refused:
        print(f"trainmon profile: {url} {refused}", file=err)
        return EXIT_REFUSED if refused.status_code in (403, 404, 409, 429, 400) \
            else EXIT_INCOMPLETE
    request_id = str(status["id"])
    if not as_json:
        print(f"profiling {status['steps']} step(s) of rank(s) "
              f"{', '.join(map(str, status['ranks']))} of job {job} (request {request_id})",
              file=out)
    def wait(seconds: float) -> bool:
        sleep(seconds)
        return False  # the command stops only when the request closes or time is up

    try:
        status = client.follow(status, until=clock() + wait_seconds, clock=clock, wait=wait)
    except ProfileUnreachable as error:
        print(f"trainmon profile: {error}", file=err)
        return EXIT_INCOMPLETE
    states = status.get("ranks_state") or {}
    if as_json:
        print(json.dumps(status, indent=2, sort_keys=True), file=out)
    else:
        for rank, state in sorted(states.items(), key=lambda item: int(item[0])):
            print(rank_text(int(rank), state), file=out)
        if status.get("open"):
            print(f"still waiting after {wait_seconds:.0f} s; follow it with "
                  f"curl '{client.target}?id={request_id}'", file=out)
    stored = all(isinstance(state, Mapping) and state.get("state") == "stored"
                 for state in states.values())
    return EXIT_OK if stored and states and not status.get("open") else EXIT_INCOMPLETE


def rank_text(rank: int, state: Mapping[str, object]) -> str:
    """One rank's outcome: its trace and top operators, or what became of it."""
    if state.get("state") != "stored":
        return f"rank {rank}: {unstored_reason(state)}"
    lines = [f"rank {rank}: {state.get('steps')} step(s) in "
             f"{_number(state.get('seconds')):.2f} s; trace {state.get('trace')} "
             f"({_number(state.get('trace_bytes')) / 1e6:.1f} MB)"]
    for title, key in (("cpu", "top_cpu"), ("device", "top_device")):
        if state.get(key):
            lines.append(f"  top operators ({title} self time): {operators_text(state[key])}")
    return "\n".join(lines)


def unstored_reason(state: Mapping[str, object]) -> str:
    """Why a rank has no trace kept (yet): its state in words, or its error."""
    what = state.get("state")
    return {"pending": "no answer yet (does the job report over the unix socket?)",
            "receiving": "its trace is being written",
            "expired": "never answered (does the job report over the unix socket, "
                       "and does it still step?)"}.get(str(what), str(state.get("error")
                                                              or what))


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0
