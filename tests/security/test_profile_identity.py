"""Only a job's owner (and root) may profile it, and only its own ranks may answer.

A real ``trainmon serve`` (root, as on a node) and two real local users that the test
creates: the victim's job reports over the shared socket; the attacker asks for a
profile of it over loopback HTTP (the kernel names its uid), then, reading the open
request's id from the request file every user may read, answers it with a forged
profile line and a trace of its own over the socket. docs/security.md, "Profiles".
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.security.security_support import (
    AsUser,
    LocalUser,
    Node,
    python_for_everyone,
    step_line,
)

pytestmark = pytest.mark.integration

#: POSTs a JSON body to the daemon's /api/v1/profile; prints the status and body.
ASK = r"""
import http.client, json, sys, urllib.parse
url = urllib.parse.urlsplit(sys.argv[1])
connection = http.client.HTTPConnection(url.netloc, timeout=10)
connection.request("POST", "/api/v1/profile", body=sys.argv[2],
                   headers={"Content-Type": "application/json"})
response = connection.getresponse()
print(json.dumps({"status": response.status, "body": json.loads(response.read())}))
"""

#: Sends a profile line to the socket with a trace of the sender's own beside it.
ANSWER = r"""
import array, gzip, os, socket, sys, tempfile
with tempfile.TemporaryFile() as trace:
    trace.write(gzip.compress(b'{"traceEvents": []}'))
    trace.flush()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [trace.fileno()]))]
        sock.sendmsg([sys.argv[2].encode()], rights, 0, sys.argv[1])
"""


def as_user_run(user: LocalUser | None, script: str, *arguments: str) -> str:
    extra = {} if user is None else {"user": user.uid, "group": user.gid, "extra_groups": []}
    done = subprocess.run([python_for_everyone(), "-I", "-c", script, *arguments],
                          capture_output=True, text=True, timeout=60, check=True, cwd="/",
                          **extra)  # type: ignore[call-overload]
    return str(done.stdout)


def ask(node: Node, user: LocalUser | None, body: dict[str, object]) -> tuple[int, dict]:
    answer = json.loads(as_user_run(user, ASK, node.daemon.url, json.dumps(body)))
    return int(answer["status"]), dict(answer["body"])


def status(node: Node, request_id: str) -> dict[str, object]:
    with urllib.request.urlopen(f"{node.daemon.url}/api/v1/profile?id={request_id}",
                                timeout=10) as answer:
        found: dict[str, object] = json.loads(answer.read())
    return found


def test_another_user_can_neither_ask_for_nor_answer_a_profile_of_a_job(
    node: Node, as_user: AsUser, local_users: tuple[LocalUser, LocalUser], shared_dir: Path,
) -> None:
    victim, attacker = local_users
    as_user(victim, node.socket, [step_line()])
    node.wait("trainmon_training_steps_total", 1000, "the victim's steps", job="victim",
              rank="0")

    refused, body = ask(node, attacker, {"job": "victim", "steps": 3})
    assert (refused, body["error"]) == (403, "forbidden")
    node.wait("trainmon_profile_requests_total", 1, "the refusal counted", result="forbidden")
    assert not (shared_dir / "profile-requests.json").exists()  # nothing was asked
    assert f"refused a profile of job 'victim' to uid:{attacker.uid}" in node.daemon.log()

    accepted, opened = ask(node, victim, {"job": "victim", "steps": 3})
    assert accepted == 202 and opened["ranks"] == [0]
    published = json.loads((shared_dir / "profile-requests.json").read_text())
    assert published["requests"][0]["id"] == opened["id"]  # every user may read it

    forged = json.dumps({
        "v": 1, "type": "profile", "job": "victim", "rank": 0, "reporter_id": "forged0000000000",
        "run": "victim-run-1", "id": opened["id"], "steps": 3, "seconds": 0.1,
        "top_cpu": [{"name": "aten::forged", "self_seconds": 1, "share": 1, "calls": 1}]})
    as_user_run(attacker, ANSWER, str(shared_dir / "steps.sock"), forged)
    node.wait("trainmon_profile_results_total", 1, "the forged answer refused",
              result="forbidden")
    assert status(node, str(opened["id"]))["ranks_state"] == {"0": {"state": "pending"}}
    assert node.value("trainmon_profile_traces") == 0

    # root may ask too: it passes the owner check, and meets the request under way
    conflict, body = ask(node, None, {"job": "victim"})
    assert (conflict, body["error"]) == (409, "conflict")
