"""Step-report ingest: trainmon's receiver vs Debian's ``prometheus-pushgateway``.

Eight sender processes push the same per-rank step data (steps, samples,
step-time histogram, data wait, one phase; 128 ranks per sender) on loopback:

- to ``trainmon serve`` as protocol v1 reports over the unix datagram socket
  (what ``trainmon.client.Reporter`` does) and over ``POST /api/v1/steps``;
- to ``prometheus-pushgateway`` as the equivalent Prometheus text, one
  ``PUT /metrics/job/<job>/rank/<rank>`` per report (keep-alive connections).

**Capacity**: every sender pushes as fast as the transport accepts (blocking
sockets, so nothing can be lost) and the rate counts reports the daemon has
*applied* (trainmon's ``trainmon_training_reports_total``; a Pushgateway PUT
is applied when it answers). **Realistic rate**: the senders then pace
themselves at a fixed rate with non-blocking sends, as the client does, and
the table shows how many reports were lost. Below the table: the Pushgateway's
mean time per PUT with a single sender, and the daemon's CPU time (user +
system, ``/proc/<pid>/stat``) per report applied in the unix capacity run.

    .venv/bin/python -m bench.training_ingest
    .venv/bin/python -m bench.training_ingest --reports 5000 --pushgateway-reports 300

Prints a markdown table for docs/benchmarks.md. ``--redaction`` times the secret rule
(``trainmon.training.redaction``) in process instead, on a typical run description and
on one full of secret-bearing text, against the rule it replaced (issue 35), and the
daemon's whole validation of the description (``protocol.parse``); the full run prints
that line too.

    .venv/bin/python -m bench.training_ingest --redaction
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import timeit
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import benchlib
from trainmon.client.transport import UnixDatagramSender
from trainmon.contract import STEP_BUCKET_COUNT, STEP_SECONDS_BOUNDS

SENDERS = 8
RANKS_PER_SENDER = 128
PUSHGATEWAY = "/usr/bin/prometheus-pushgateway"
#: PUTs of the single-sender latency measurement (one sender, one group at a time).
SINGLE_PUTS = 50


# -- the secret rule's cost on a run description -----------------------------------

#: A run description as the client builds it for a typical job.
TYPICAL_DESCRIPTION: dict[str, Any] = {
    "v": 1, "type": "run", "job": "llama-7b", "rank": 3, "reporter_id": "a1b2c3d4e5f60718",
    "run": "20261201T101500Z-1a2b3c4d", "started": 1_796_120_100.0, "world_size": 64,
    "config_hash": "sha256:0123456789abcdef",
    "config": {
        **{f"model.layer{index}.dim": 4096 for index in range(8)},
        "optimizer.name": "adamw", "optimizer.betas": "[0.9,0.95]", "lr": 3e-4,
        "lr_schedule": "cosine", "data.root": "/mnt/cfs/imagenet/train",
        "precision": "bf16-mixed", "model.name": "llama-7b", "batch_size": 1024,
        "tokenizer.path": "/models/llama/tokenizer.model", "seed": 42,
        "run_name": "exp-2024-01-01-lr3e-4-bs1024", "output_dir": "/checkpoints/exp42",
        "command": "torchrun --nproc_per_node 8 train.py --config configs/llama.yaml "
                   "--lr 3e-4 --batch-size 1024",
    },
    "environment": {
        "NCCL_DEBUG": "WARN", "NCCL_IB_HCA": "mlx5_0,mlx5_1,mlx5_2,mlx5_3",
        "NCCL_SOCKET_IFNAME": "eth0", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
        "OMP_NUM_THREADS": "8", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TORCHELASTIC_RUN_ID": "none",
    },
    "data_paths": ["/mnt/cfs/imagenet/train", "/mnt/cfs/imagenet/val"],
    "versions": {"python": "3.11.7", "trainmon": "0.9.0", "torch": "2.3.1+cu121",
                 "cuda": "12.1", "nccl": "2.20.5"},
    "git": None, "host": "node-1",
    "framework": {"precision": "bf16-mixed", "accumulate_grad_batches": 4},
}
#: The same with presigned URLs, a webhook, credentials and tokens in its values.
SECRET_DESCRIPTION: dict[str, Any] = {
    **TYPICAL_DESCRIPTION,
    "config": {
        **TYPICAL_DESCRIPTION["config"],
        "data.url": "https://ckpt.s3.amazonaws.com/shard.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256"
                    "&X-Amz-Credential=AKIAJQ7EXAMPLEKEY92%2F2024&X-Amz-Signature=5d41402abc",
        "notify": "https://hooks.slack.com/services/T0FAKE123/B0FAKE456/XyZfakeHook42",
        "mirror": "https://bob:p@ssw0rd@pypi.internal/simple",
        "command": "python train.py --password=hunter2 --hub-token hf_QKSKJQXHiuwzHrCfmtCKl"
                   "EzQVGhGDNabEU --lr 3e-4",
        "llm": "sk-proj-dbpufkvkKeE2xfskKeR6iIU0C0FuzNycqXMX9DGJ_Wc401hQvJEgeyz2mCyRa",
    },
    "data_paths": ["/work/s3:/AKIAQ6X69ZFO9SW27FUM:je7MtGbClwBF@bucket/imagenet",
                   "/mnt/cfs/imagenet/val"],
}


def _previous_rule(value: str) -> str:
    """The rule this one replaced (URL userinfo only; 629e98b), for the comparison."""
    if "@" not in value:
        return value
    value = _PREVIOUS_URL.sub(r"\1<redacted>@", value)
    return _PREVIOUS_BARE.sub(r"\1<redacted>@", value)


_PREVIOUS_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*:/{1,2})[^/@\s]+@")
_PREVIOUS_BARE = re.compile(r"(^|[/\s])[^/@\s:]+:[^/@\s]+@")


def _strings(description: dict[str, Any]) -> list[str]:
    """Every string the daemon redacts in ``description``: values, keys, paths."""
    found = [*description["data_paths"], *description["versions"].values()]
    for section in ("config", "framework", "environment"):
        found += [str(key) for key in description[section] if section != "environment"]
        found += [value for value in description[section].values() if isinstance(value, str)]
    return found


def redaction_cost(repeat: int = 2000) -> list[str]:
    """Lines: per run description, the previous and the current rule over its strings,
    and ``protocol.parse`` of the whole line (validation with the current rule), µs."""
    from trainmon.training.protocol import parse
    from trainmon.training.redaction import redact_text

    def best(work: Callable[[], object]) -> float:
        return min(timeit.repeat(work, number=repeat, repeat=7)) / repeat * 1e6

    lines = ["| run description | strings | previous rule | this rule | whole parse() |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, description in (("typical", TYPICAL_DESCRIPTION),
                              ("with 8 secrets", SECRET_DESCRIPTION)):
        strings = _strings(description)
        line = json.dumps(description).encode()
        before = best(lambda: [_previous_rule(text) for text in strings])  # noqa: B023
        after = best(lambda: [redact_text(text) for text in strings])  # noqa: B023
        whole = best(lambda: parse(line))  # noqa: B023
        lines.append(f"| {name} ({len(line):,} bytes) | {len(strings)} | {before:.1f} µs "
                     f"| {after:.1f} µs | {whole:.0f} µs |")
    return lines


# -- the step data, in both formats ------------------------------------------------


def step_data(sender: int, index: int) -> dict[str, Any]:
    """The cumulative totals of rank ``sender*128 + index%128`` after ``index`` reports."""
    steps = 100 + index
    buckets = [0] * STEP_BUCKET_COUNT
    buckets[4], buckets[5] = steps - steps // 4, steps // 4
    return {
        "v": 1, "job": "bench", "rank": sender * RANKS_PER_SENDER + index % RANKS_PER_SENDER,
        "local_rank": sender, "world_size": SENDERS * RANKS_PER_SENDER, "gpu": str(sender),
        "pid": 1000 + sender, "reporter_id": f"bench{sender:02d}{index % RANKS_PER_SENDER:04d}",
        "steps": steps, "samples": steps * 32, "step_seconds": steps * 0.3,
        "data_wait_seconds": steps * 0.1, "phase_seconds": {"comm": steps * 0.05},
        "step_buckets": buckets, "dropped_reports": 0, "last_step_time": time.time(),
    }


def trainmon_line(sender: int, index: int) -> bytes:
    return json.dumps(step_data(sender, index), separators=(",", ":")).encode() + b"\n"


def pushgateway_text(sender: int, index: int) -> tuple[str, bytes]:
    data = step_data(sender, index)
    rows = [
        "# TYPE trainmon_training_steps_total counter",
        f"trainmon_training_steps_total {data['steps']}",
        "# TYPE trainmon_training_samples_total counter",
        f"trainmon_training_samples_total {data['samples']}",
        "# TYPE trainmon_training_data_wait_seconds_total counter",
        f"trainmon_training_data_wait_seconds_total {data['data_wait_seconds']}",
        "# TYPE trainmon_training_phase_seconds_total counter",
        f'trainmon_training_phase_seconds_total{{phase="comm"}} {data["phase_seconds"]["comm"]}',
        "# TYPE trainmon_training_step_seconds histogram",
    ]
    cumulative = 0
    for bound, count in zip([*map(repr, STEP_SECONDS_BOUNDS), "+Inf"], data["step_buckets"],
                            strict=True):
        cumulative += count
        rows.append(f'trainmon_training_step_seconds_bucket{{le="{bound}"}} {cumulative}')
    rows += [f"trainmon_training_step_seconds_sum {data['step_seconds']}",
             f"trainmon_training_step_seconds_count {data['steps']}"]
    return f"/metrics/job/bench/rank/{data['rank']}", ("\n".join(rows) + "\n").encode()


# -- senders (run in their own processes) ---------------------------------------------


def send_unix(path: str, sender: int, count: int) -> tuple[int, int]:
    """Send ``count`` reports as fast as a blocking socket allows (nothing is refused)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        for index in range(count):
            sock.sendto(trainmon_line(sender, index), path)
    return count, 0


def send_client_paced(path: str, sender: int, count: int, rate: float) -> tuple[int, int]:
    """Send ``count`` reports at ``rate``/s through the client's own non-blocking transport."""
    transport = UnixDatagramSender(path)
    delivered = refused = 0
    started = time.perf_counter()
    for index in range(count):
        delay = started + index / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        if transport.send(trainmon_line(sender, index)):
            delivered += 1
        else:
            refused += 1
    transport.close()
    return delivered, refused


class KeepAlive:
    """One persistent HTTP/1.1 connection that reconnects when the server closes it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def request(self, method: str, path: str, body: bytes) -> int:
        for attempt in (1, 2):
            try:
                self.connection.request(method, path, body=body)
                response = self.connection.getresponse()
                response.read()
                return response.status
            except (http.client.HTTPException, ConnectionError):
                self.connection.close()
                self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def send_trainmon_http(port: int, sender: int, count: int) -> tuple[int, int]:
    client = KeepAlive(port)
    failed = sum(client.request("POST", "/api/v1/steps", trainmon_line(sender, index)) != 200
                 for index in range(count))
    return count - failed, failed


def send_pushgateway(port: int, sender: int, count: int) -> tuple[int, int]:
    client = KeepAlive(port)
    failed = 0
    for index in range(count):
        path, body = pushgateway_text(sender, index)
        failed += client.request("PUT", path, body) != 200
    return count - failed, failed


def _worker(job: Callable[..., tuple[int, int]], args: tuple[Any, ...], start: Any,
            results: Any) -> None:
    start.wait()
    results.put(job(*args))


def run_senders(
    job: Callable[..., tuple[int, int]], args_of: Callable[[int], tuple[Any, ...]],
    applied: Callable[[], int] | None = None, baseline: int = 0,
) -> tuple[float, int, int]:
    """Run SENDERS processes at once; returns (seconds until all applied, sent, lost).

    With ``applied``, waits until the daemon has applied every sent report
    (``applied() - baseline``) or 60 s have passed.
    """
    context = multiprocessing.get_context("fork")
    start, results = context.Event(), context.Queue()
    workers = [context.Process(target=_worker, args=(job, args_of(sender), start, results))
               for sender in range(SENDERS)]
    for worker in workers:
        worker.start()
    began = time.perf_counter()
    start.set()
    outcomes = [results.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join()
    sent = sum(count for count, _ in outcomes)
    if applied is not None:
        deadline = time.monotonic() + 60
        while applied() - baseline < sent and time.monotonic() < deadline:
            time.sleep(0.02)
    seconds = time.perf_counter() - began
    return seconds, sent, sum(lost for _, lost in outcomes)


# -- the daemons -----------------------------------------------------------------------


@dataclass
class Trainmon:
    daemon: benchlib.Daemon
    socket_path: str

    @property
    def port(self) -> int:
        return self.daemon.port

    def accepted(self) -> int:
        with urllib.request.urlopen(f"{self.daemon.url}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        return sum(int(float(row.rsplit(" ", 1)[1])) for row in text.splitlines()
                   if row.startswith("trainmon_training_reports_total{"))


def start_trainmon(folder: Path) -> Trainmon:
    config, sock = benchlib.training_only_config(folder)
    return Trainmon(benchlib.start_trainmon(config, quiet=True), str(sock))


def start_pushgateway() -> tuple[subprocess.Popen[bytes], int]:
    port = benchlib.free_port()
    process = subprocess.Popen(
        [PUSHGATEWAY, f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    benchlib.wait_ready(f"http://127.0.0.1:{port}/-/ready", process)
    return process, port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reports", type=int, default=20_000,
                        help="reports per sender over the unix socket (capacity run)")
    parser.add_argument("--http-reports", type=int, default=500,
                        help="reports per sender over trainmon's HTTP route")
    parser.add_argument("--pushgateway-reports", type=int, default=250,
                        help="PUTs per sender to the Pushgateway")
    parser.add_argument("--rate", type=float, default=32.0,
                        help="reports/s per sender in the realistic-rate run (8×32: a node "
                             "with 256 ranks, each reporting once a second)")
    parser.add_argument("--stress-rate", type=float, default=250.0,
                        help="reports/s per sender in the stress run")
    parser.add_argument("--rate-seconds", type=float, default=5.0)
    parser.add_argument("--redaction", action="store_true",
                        help="time only the secret rule on run descriptions (in process)")
    args = parser.parse_args()
    if args.redaction:
        print("\n".join(redaction_cost()))
        return
    if not shutil.which(PUSHGATEWAY):
        sys.exit(f"{PUSHGATEWAY} is missing: apt-get install prometheus-pushgateway")

    rows: list[tuple[str, float, int, int]] = []
    with tempfile.TemporaryDirectory() as folder:
        trainmon = start_trainmon(Path(folder))
        gateway, gateway_port = start_pushgateway()
        try:
            baseline = trainmon.accepted()
            cpu_before = benchlib.cpu_seconds(trainmon.daemon.process.pid)
            seconds, sent, lost = run_senders(
                send_unix, lambda s: (trainmon.socket_path, s, args.reports),
                trainmon.accepted, baseline,
            )
            applied = trainmon.accepted() - baseline
            # includes the few /metrics scrapes of accepted(): an upper bound
            cpu_per_report = (benchlib.cpu_seconds(trainmon.daemon.process.pid)
                              - cpu_before) / max(1, applied)
            rows.append(("trainmon, unix datagram (capacity)", applied / seconds, sent,
                         sent - applied))
            baseline = trainmon.accepted()
            seconds, sent, lost = run_senders(
                send_trainmon_http, lambda s: (trainmon.port, s, args.http_reports),
            )
            applied = trainmon.accepted() - baseline
            rows.append(("trainmon, HTTP POST /api/v1/steps (capacity)", applied / seconds,
                         sent, sent - applied))
            seconds, sent, lost = run_senders(
                send_pushgateway, lambda s: (gateway_port, s, args.pushgateway_reports),
            )
            rows.append(("Pushgateway, HTTP PUT (capacity)", sent / seconds, sent, lost))
            started = time.perf_counter()
            send_pushgateway(gateway_port, 0, SINGLE_PUTS)  # one sender, one group at a time
            put_seconds = (time.perf_counter() - started) / SINGLE_PUTS
            for rate in (args.rate, args.stress_rate):
                count = int(rate * args.rate_seconds)
                baseline = trainmon.accepted()
                seconds, sent, lost = run_senders(
                    send_client_paced, lambda s: (trainmon.socket_path, s, count, rate),  # noqa: B023
                    trainmon.accepted, baseline,
                )
                applied = trainmon.accepted() - baseline
                rows.append((f"trainmon, client transport paced at {SENDERS}×{rate:.0f}/s",
                             applied / seconds, SENDERS * count, SENDERS * count - applied))
        finally:
            trainmon.daemon.stop()
            benchlib.stop(gateway)

    gateway_rate = rows[2][1]
    qlen = Path("/proc/sys/net/unix/max_dgram_qlen").read_text().strip()
    print(f"{SENDERS} sender processes, {SENDERS * RANKS_PER_SENDER} ranks, "
          f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, loopback, "
          f"net.unix.max_dgram_qlen={qlen}\n")
    print("| ingest path | reports/s applied | reports sent | lost | vs Pushgateway |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, rate, sent, lost in rows:
        ratio = f"{rate / gateway_rate:.1f}×" if "capacity" in name else "— (paced)"
        print(f"| {name} | {rate:,.0f} | {sent:,} | {lost:,} | {ratio} |")
    print(f"\nPushgateway with a single sender: {put_seconds * 1000:.1f} ms per PUT "
          f"(mean of {SINGLE_PUTS}, keep-alive)")
    print(f"trainmon daemon CPU (user + system) per applied report, unix capacity run: "
          f"{cpu_per_report * 1e6:.0f} µs")
    print("\nThe secret rule per run description (in process, best of 7):\n")
    print("\n".join(redaction_cost()))


if __name__ == "__main__":
    main()
