"""`make stack`: it comes up, Prometheus scrapes the demo and loads the rules, Ctrl-C cleans up."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.daemon import free_port
from testkit.prometheus import wait_until
from tests.deploy.deploy_support.common import ALERTS, REPO

pytestmark = pytest.mark.integration

UP_TIMEOUT_SECONDS = 180  # includes make's set-up on a machine where it is needed


class OutputReader:
    """Lines of a process's output, read on a thread so the test never blocks on them."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(process,), daemon=True).start()

    def _pump(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def until(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                break
            self.lines.append(line)
            match = re.search(pattern, line)
            if match:
                return match
        raise AssertionError(f"no line matching {pattern!r}:\n{self.text()}")

    def text(self) -> str:
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.lines.append(line)
        return "".join(self.lines)


def process_table() -> dict[int, tuple[int, int, str]]:
    """pid → (parent pid, start time in clock ticks, command name), from /proc."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        table[int(entry.name)] = (int(fields[1]), int(fields[19]), name)
    return table


def descendants(root: int) -> dict[int, tuple[int, str]]:
    """Every process below ``root`` (and root): pid → (start time, name)."""
    table = process_table()
    found = {root: (table[root][1], table[root][2])}
    changed = True
    while changed:
        changed = False
        for pid, (parent, start, name) in table.items():
            if parent in found and pid not in found:
                found[pid] = (start, name)
                changed = True
    return found


def still_running(processes: dict[int, tuple[int, str]]) -> list[str]:
    table = process_table()
    return [
        f"{pid} {name}"
        for pid, (start, name) in processes.items()
        if pid in table and table[pid][1] == start and table[pid][0] != 0
    ]


def api(port: int, path: str, **query: str) -> Any:
    url = f"http://127.0.0.1:{port}/api/v1/{path}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)["data"]


def port_is_free(port: int) -> bool:
    """Nothing listens there (connections in TIME_WAIT do not count, as for any server)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def shipped_group_names() -> set[str]:
    names: set[str] = set()
    for path in (ALERTS / "dcgm").glob("*.yml"):
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        names.update(group["name"] for group in document.get("groups", []))
    return names


def test_make_stack_comes_up_and_stops_cleanly_on_ctrl_c() -> None:
    trainmon, prometheus, alertmanager = free_port(), free_port(), free_port()
    arguments = (
        f"--trainmon-port {trainmon} --prometheus-port {prometheus} "
        f"--alertmanager-port {alertmanager}"
    )
    process = subprocess.Popen(
        ["make", "--no-print-directory", "stack", f"ARGS={arguments}"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        env={key: value for key, value in os.environ.items() if not key.startswith("MAKE")},
    )
    output = OutputReader(process)
    processes: dict[int, tuple[int, str]] = {}
    try:
        workdir = Path(output.until(r"logs and data\s+(\S+)", UP_TIMEOUT_SECONDS).group(1))
        assert f"http://127.0.0.1:{prometheus}/alerts" in output.text()
        processes = descendants(process.pid)
        names = {name for _, name in processes.values()}
        assert {"prometheus", "prometheus-aler"} <= names, names  # comm is 15 characters

        # Prometheus scrapes the demo daemon, with the node label of the target list.
        def trainmon_target() -> dict[str, Any] | None:
            for target in api(prometheus, "targets")["activeTargets"]:
                if target["labels"]["job"] == "trainmon" and target["health"] == "up":
                    return dict(target)
            return None

        target = wait_until(trainmon_target, 60, "the trainmon target to be up", interval=0.25)
        assert target["labels"]["instance"] == f"127.0.0.1:{trainmon}"
        assert target["labels"]["node"] == "demo-node"
        build_info = wait_until(
            lambda: api(prometheus, "query", query='trainmon_build_info{mode="demo"}')["result"],
            30,
            "demo series in Prometheus",
            interval=0.25,
        )
        assert build_info[0]["metric"]["node"] == "demo-node"
        assert build_info[0]["metric"]["job"] == "trainmon"
        # honor_labels: step series keep the training job's name as `job`.
        steps = wait_until(
            lambda: api(prometheus, "query", query="count by (job, node) (trainmon_training_steps_total)")["result"],
            30,
            "training series in Prometheus",
            interval=0.25,
        )
        assert {(s["metric"]["job"], s["metric"]["node"]) for s in steps} == {
            ("demo-starved", "demo-node"),
            ("demo-healthy", "demo-node"),
        }

        # The variant's rules are loaded, every group of them.
        groups = {group["name"] for group in api(prometheus, "rules")["groups"]}
        assert groups == shipped_group_names() and groups

        # Prometheus sends alerts to the stack's Alertmanager.
        alertmanagers = api(prometheus, "alertmanagers")["activeAlertmanagers"]
        assert [entry["url"] for entry in alertmanagers] == [
            f"http://127.0.0.1:{alertmanager}/api/v2/alerts"
        ]

        # A page goes through the shipped routing and lands in the terminal, not
        # at the example receivers.
        page = {
            "labels": {
                "alertname": "TrainmonGPUSawtooth",
                "severity": "critical",
                "job": "demo-starved",
                "node": "demo-node",
                "gpu": "0",
            },
            "annotations": {"summary": "test page"},
        }
        request = urllib.request.Request(
            f"http://127.0.0.1:{alertmanager}/api/v2/alerts",
            data=json.dumps([page]).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
        line = output.until(r"notification → pager/\S+: FIRING TrainmonGPUSawtooth .*", 60)
        assert "job=demo-starved, node=demo-node, gpu=0" in line.group(0)
    finally:
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    log = output.text()
    assert "stopping" in log, log
    assert not still_running(processes), log
    assert all(port_is_free(port) for port in (trainmon, prometheus, alertmanager))
    assert not workdir.exists()


def test_stack_refuses_a_taken_port_before_starting_anything() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        completed = subprocess.run(
            [
                *(sys.executable, "-m", "deploy.stack", "--prometheus-port", str(taken)),
                *("--trainmon-port", str(free_port()), "--alertmanager-port", str(free_port())),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert completed.returncode == 2
    assert f"port {taken} on 127.0.0.1 is taken; use --prometheus-port" in completed.stderr
