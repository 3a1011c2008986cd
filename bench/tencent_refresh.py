"""Refresh time and API calls of the Tencent Cloud puller vs. pulling on every scrape.

Fleet: N instances (default 1000) with one CBS disk each, 14 metrics per
object (the 12 CVM metrics plus CBS read/write throughput), against the
loopback fake of the API that enforces 20 requests per second per account.

Rows, in one run:

* trainmon, batch 10 (GetMonitorData's documented object limit) and batch 50,
  at the default 15 requests/s: one full background refresh, measured whole;
* the synchronous approach of the old Go exporter — on every scrape, one
  GetMonitorData per instance per metric — paced at the same 15 requests/s
  (anything faster is throttled). It takes minutes for a full fleet, so it is
  measured on a subset (``--baseline-instances``) and extrapolated linearly
  (its cost is exactly linear: one call per object and metric);
* the same without pacing, for a few hundred calls: how much gets throttled.

Run: ``.venv/bin/python -m bench.tencent_refresh`` (about 2.5 minutes;
``--instances 200`` for a quick look). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench import benchlib
from testkit.fake_tencent_api import FakeTencentCloud
from trainmon.collectors.tencent import TencentCollector, TencentConfig
from trainmon.section import Section, read_section
from trainmon.tencent.catalogue import CATALOGUE, TargetKind
from trainmon.tencent.client import MONITOR, APIError, APIStats, TencentAPI
from trainmon.tencent.credentials import Credential, StaticCredentials
from trainmon.tencent.ratelimit import TokenBucket

ROOT = benchlib.ROOT
SECRET_ID, SECRET_KEY = "AKIDbench", "bench-secret"
METRICS = [s.tencent_name for s in CATALOGUE if s.kind is TargetKind.INSTANCE] + [
    "DiskReadTraffic", "DiskWriteTraffic",
]
RATE = 15.0
PERIOD = 60


def trainmon_refresh(cloud: FakeTencentCloud, instances: list[str], batch: int) -> dict[str, Any]:
    disks = {i: [f"disk-{i}-0"] for i in instances}
    section = {
        "enabled": True, "endpoint": cloud.url, "region": "ap-shanghai",
        "secret_id": SECRET_ID, "secret_key": "${BENCH_KEY}", "instances": instances,
        "disks": disks, "metrics": METRICS, "batch_size": batch, "rate_limit": RATE,
        "concurrency": 8,
    }
    config = read_section(TencentConfig, Section(section, "collectors.tencent",
                                                 {"BENCH_KEY": SECRET_KEY}))
    collector = TencentCollector(config)
    before = cloud.count("GetMonitorData")
    throttled = cloud.count(code="RequestLimitExceeded")
    report = collector.refresh()
    started = time.perf_counter()
    families = list(collector.collect())
    scrape = time.perf_counter() - started
    names = {f"trainmon_tencent_{k}" for k in ("cvm", "cbs")}
    series = sum(len(f.samples) for f in families if any(f.name.startswith(n) for n in names))
    return {
        "calls": cloud.count("GetMonitorData") - before,
        "seconds": report.duration,
        "throttled": cloud.count(code="RequestLimitExceeded") - throttled,
        "failed": report.failed,
        "series": series,
        "scrape": scrape,
        "interval": collector.health()["refresh_interval_seconds"],
    }


def synchronous(cloud: FakeTencentCloud, instances: list[str], paced: bool,
                max_calls: int | None = None) -> dict[str, Any]:
    """One GetMonitorData per object and metric, one after the other (the old way)."""
    api = TencentAPI(
        cloud.url, StaticCredentials("bench", lambda: Credential(SECRET_ID, SECRET_KEY)),
        limiter=TokenBucket(RATE if paced else 1e9), stats=APIStats(), max_retries=0,
    )
    now = time.time()
    end = int((now - 120) // PERIOD * PERIOD)
    throttled = calls = 0
    started = time.perf_counter()
    for instance in instances:
        for metric in METRICS:
            spec = next(s for s in CATALOGUE if s.tencent_name == metric)
            name = next(n for n in ("CpuUsage", "Gpumemusage") if n.lower() == metric.lower()) \
                if metric in ("CPUUsage", "GpuMemUsage") else metric
            object_id = instance if spec.kind is TargetKind.INSTANCE else f"disk-{instance}-0"
            params = {
                "Namespace": spec.namespace, "MetricName": name, "Period": PERIOD,
                "StartTime": _iso(end - 300), "EndTime": _iso(end),
                "Instances": [{"Dimensions": [{"Name": spec.kind.dimension,
                                               "Value": object_id}]}],
            }
            try:
                api.call(MONITOR, "GetMonitorData", params, "ap-shanghai")
            except APIError as error:
                throttled += error.code == "RequestLimitExceeded"
            calls += 1
            if max_calls is not None and calls >= max_calls:
                return {"calls": calls, "seconds": time.perf_counter() - started,
                        "throttled": throttled}
    return {"calls": calls, "seconds": time.perf_counter() - started, "throttled": throttled}


def _iso(timestamp: int) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(timestamp, tz=timezone.utc).isoformat()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--baseline-instances", type=int, default=20)
    parser.add_argument("--unpaced-calls", type=int, default=300)
    args = parser.parse_args()

    with FakeTencentCloud(time.time, rate_limit=20, batch_limit=50) as cloud:
        cloud.add_account(SECRET_ID, SECRET_KEY)
        fleet = [i.instance_id for i in cloud.add_fleet("ap-shanghai", args.instances,
                                                       disks_per_instance=1)]
        batch10 = trainmon_refresh(cloud, fleet, 10)
        batch50 = trainmon_refresh(cloud, fleet, 50)
        subset = fleet[: args.baseline_instances]
        paced = synchronous(cloud, subset, paced=True)
        unpaced = synchronous(cloud, fleet, paced=False, max_calls=args.unpaced_calls)

    n, m = args.instances, len(METRICS)
    scale = n / len(subset)
    sync_calls, sync_seconds = paced["calls"] * scale, paced["seconds"] * scale
    print(f"Fleet: {n} instances + {n} disks, {m} metrics ({n * m} series), fake API limit "
          f"20 req/s, trainmon at {RATE:g} req/s.\n")
    print("| approach | GetMonitorData calls per refresh | refresh (or scrape) time | "
          "inside a 60 s period | throttled | series exposed | scrape time |")
    print("| --- | ---: | ---: | :---: | ---: | ---: | ---: |")
    for label, row in (("trainmon, batch 10 (documented limit)", batch10),
                       ("trainmon, batch 50", batch50)):
        fits = "yes" if row["seconds"] <= PERIOD else f"no: refreshes every {row['interval']:.0f} s"
        print(f"| {label} | {row['calls']} | {row['seconds']:.1f} s | {fits} | "
              f"{row['throttled']} | {row['series']} | {row['scrape'] * 1000:.0f} ms |")
    print(f"| synchronous per scrape, paced {RATE:g} req/s (measured {len(subset)} instances, "
          f"×{scale:g}) | {sync_calls:.0f} | {sync_seconds:.0f} s | no | {paced['throttled']} | "
          f"— | {sync_seconds:.0f} s |")
    share = unpaced["throttled"] / unpaced["calls"]
    print(f"| synchronous per scrape, unpaced (first {unpaced['calls']} calls) | — | "
          f"{unpaced['seconds']:.1f} s for {unpaced['calls']} calls | — | "
          f"{unpaced['throttled']} ({share:.0%}) | — | — |")
    print()
    print(f"Calls: synchronous / trainmon = {sync_calls / batch10['calls']:.0f}× (batch 10), "
          f"{sync_calls / batch50['calls']:.0f}× (batch 50). Time for one full pass: "
          f"{sync_seconds / batch10['seconds']:.1f}× / {sync_seconds / batch50['seconds']:.1f}×. "
          f"Scrape latency: {sync_seconds:.0f} s vs {batch10['scrape'] * 1000:.0f} ms.")


if __name__ == "__main__":
    main()
