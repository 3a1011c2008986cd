"""Sharded scrapers (deploy/sharding.py, deploy/scale/): the files are current, the real
vmagent and Prometheus agent accept them, and N shards split a fleet exactly as predicted.

The fleet here is 30 loopback targets served by one HTTP server in the test: the
target list tells them apart by ``__metrics_path__`` and gives each its ``node``.
Three vmagents (the shipped file, shard from the environment) and three Prometheus
agents (rendered configs) scrape it into one VictoriaMetrics; every scraper adds
``scraper`` and ``shard`` labels, so a node scraped twice shows up as two series.
"""

from __future__ import annotations

import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy import sharding
from deploy.bundle import prometheus_config
from testkit.prometheus import PROMETHEUS, LoopbackProcess, require, wait_until
from testkit.victoriametrics import VictoriaMetrics, VMAgent
from tests.deploy.deploy_support.common import DEPLOY, VARIANTS, run, tool

SHARDS = 3
NODES = [f"node-{index:02d}" for index in range(30)]
SHARD_ENV = {"TRAINMON_SHARD_COUNT": str(SHARDS)}


def _copy_beside_targets(config_text: str, folder: Path, name: str = "scraper.yml") -> Path:
    """``config_text`` as ``folder/name`` beside the example target lists it names."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(DEPLOY / "prometheus" / "targets", folder / "targets", dirs_exist_ok=True)
    path = folder / name
    path.write_text(config_text, encoding="utf-8")
    return path


def test_the_shipped_files_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    assert sharding.main(["--check"]) == 0, capsys.readouterr().err


def test_check_reports_a_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for variant in VARIANTS:
        shutil.copy(sharding.output_path(variant), tmp_path)
    stale = sharding.output_path("dcgm", tmp_path)
    stale.write_text(stale.read_text().replace("scrape_interval: 15s", "scrape_interval: 30s"))
    assert sharding.main(["--check", "--scale-dir", str(tmp_path)]) == 1
    assert str(stale) in capsys.readouterr().err


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_scrape_jobs_are_the_prometheus_ones_plus_the_shard_rules(variant: str) -> None:
    source = yaml.safe_load(prometheus_config(variant).read_text())
    config = sharding.load_vmagent_config(sharding.output_path(variant), shard_count=4, shard=2)
    assert set(config) == {"global", "scrape_configs"}, "no rules or alerting: vmalert has them"
    assert config["global"] == {
        key: source["global"][key] for key in ("scrape_interval", "scrape_timeout")
    }
    assert [job["job_name"] for job in config["scrape_configs"]] == [
        job["job_name"] for job in source["scrape_configs"]
    ]
    for job, original in zip(config["scrape_configs"], source["scrape_configs"], strict=True):
        *own, hashmod, keep = job["relabel_configs"]
        assert {**job, "relabel_configs": own} == original
        assert hashmod == {
            "source_labels": ["node"], "modulus": 4, "target_label": "__tmp_shard",
            "action": "hashmod",
        }
        assert keep == {"source_labels": ["__tmp_shard"], "regex": "2", "action": "keep"}


def test_an_unsharded_scraper_has_no_shard_rules() -> None:
    config = sharding.scraper_config("dcgm", engine="prometheus-agent", remote_write="http://vm/w")
    source = yaml.safe_load(prometheus_config("dcgm").read_text())
    assert config["scrape_configs"] == source["scrape_configs"]
    assert config["remote_write"] == [{"url": "http://vm/w"}]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"engine": "prometheus"}, "unknown engine"),
        ({"engine": "prometheus-agent", "shards": 3}, "needs --shard"),
        ({"engine": "prometheus-agent", "shards": 3, "shard": 3}, "not one of 0..2"),
        ({"engine": "vmagent", "remote_write": "http://vm/w"}, "-remoteWrite.url"),
        ({"engine": "vmagent", "shards": 0}, "at least 1"),
    ],
)
def test_impossible_scrapers_are_refused(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(sharding.ShardingError, match=message):
        sharding.scraper_config("dcgm", **arguments)


def test_render_prints_a_config_and_refuses_bad_arguments(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["render", "--variant", "tencent-cloud", "--engine", "prometheus-agent",
            "--shards", "2", "--shard", "1", "--remote-write", "http://vm:8428/api/v1/write"]
    assert sharding.main(argv) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == sharding.scraper_config(
        "tencent-cloud", engine="prometheus-agent", shards=2, shard=1,
        remote_write="http://vm:8428/api/v1/write",
    )
    assert sharding.main(argv[:-4]) == 2
    assert "needs --shard" in capsys.readouterr().err


def test_placeholders_without_a_value_are_an_error() -> None:
    text = sharding.output_path("dcgm").read_text()
    with pytest.raises(sharding.ShardingError, match="TRAINMON_SHARD_COUNT"):
        sharding.expand_placeholders(text, {"TRAINMON_SHARD": "0"})


def test_xxhash64_matches_the_reference_vectors() -> None:
    # xxHash's published values (seed 0), short and multi-stripe inputs.
    assert sharding.xxhash64(b"") == 0xEF46DB3751D8E999
    assert sharding.xxhash64(b"a") == 0xD24EC4F1A98C6E5B
    assert sharding.xxhash64(b"abc") == 0x44BC2CF5AD770999
    assert sharding.xxhash64(b"Nobody inspects the spammish repetition") == 0xFBCEA83C8A378BF1


@pytest.mark.integration
@pytest.mark.parametrize("variant", VARIANTS)
def test_vmagent_accepts_the_shipped_file(variant: str, tmp_path: Path) -> None:
    path = _copy_beside_targets(sharding.output_path(variant).read_text(), tmp_path)
    command = [tool("vmagent"), f"-promscrape.config={path}", "-promscrape.config.dryRun"]
    for shard in range(SHARDS):
        completed = run(command, env={**SHARD_ENV, "TRAINMON_SHARD": str(shard)}, timeout=30)
        assert completed.returncode == 0, completed.stdout + completed.stderr
        assert "-promscrape.config is ok" in completed.stdout + completed.stderr
    # The header's claim: without its environment the file does not parse.
    assert run(command, env={"TRAINMON_SHARD_COUNT": "", "TRAINMON_SHARD": ""},
               timeout=30).returncode != 0


@pytest.mark.integration
@pytest.mark.parametrize("variant", VARIANTS)
def test_promtool_accepts_prometheus_agent_shards(variant: str, tmp_path: Path) -> None:
    for shard in range(SHARDS):
        config = sharding.scraper_config(
            variant, engine="prometheus-agent", shards=SHARDS, shard=shard,
            remote_write="http://127.0.0.1:8428/api/v1/write",
        )
        path = _copy_beside_targets(sharding.to_yaml(config), tmp_path, f"agent-{shard}.yml")
        completed = run([tool("promtool"), "check", "config", "--agent", str(path)])
        assert completed.returncode == 0, completed.stdout + completed.stderr


# ---------------------------------------------------------------------------
# A real split: 30 targets, 3 vmagents and 3 Prometheus agents, one VictoriaMetrics.


class _AnyPath(BaseHTTPRequestHandler):
    body = b"# TYPE tiny_ready gauge\ntiny_ready 1\n"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: one line per scrape would flood the test output."""


@pytest.fixture
def fleet_targets(tmp_path: Path) -> Iterator[Path]:
    """A ``targets/`` folder (trainmon: 30 nodes, dcgm-exporter: none) on one server."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _AnyPath)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        folder = tmp_path / "targets"
        folder.mkdir()
        address = f"127.0.0.1:{server.server_address[1]}"
        groups = [
            {"targets": [address],
             "labels": {"node": node, "__metrics_path__": f"/nodes/{node}/metrics"}}
            for node in NODES
        ]
        (folder / "trainmon.yml").write_text(yaml.safe_dump(groups))
        (folder / "dcgm-exporter.yml").write_text("[]\n")
        yield folder
    finally:
        server.shutdown()
        server.server_close()


class PrometheusAgent(LoopbackProcess):
    """``prometheus --enable-feature=agent``: scrape and remote-write, no local queries."""

    name = "prometheus-agent"

    def start(self, config: dict[str, Any], timeout: float = 30.0) -> PrometheusAgent:
        config_path = self.workdir / "agent.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.start_process(
            [
                require(PROMETHEUS),
                "--enable-feature=agent",
                f"--config.file={config_path}",
                f"--storage.agent.path={self.workdir / 'agent-data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            "/-/ready",
            timeout,
        )
        return self


def _fast(text: str) -> str:
    """The shipped dcgm vmagent file scraping every second instead of every 15 s."""
    for old, new in (("scrape_interval: 15s", "scrape_interval: 1s"),
                     ("scrape_timeout: 10s", "scrape_timeout: 1s")):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_shards_split_the_fleet_by_node_hash(tmp_path: Path, fleet_targets: Path) -> None:
    processes: list[LoopbackProcess] = []
    try:
        engine = VictoriaMetrics(tmp_path).start()
        processes.append(engine)
        vmagent_config = tmp_path / "vmagent.yml"
        vmagent_config.write_text(_fast(sharding.output_path("dcgm").read_text()))
        for shard in range(SHARDS):
            workdir = tmp_path / f"vmagent-{shard}"
            workdir.mkdir()
            processes.append(VMAgent(workdir).start(
                vmagent_config, remote_write=engine.write_url,
                env={**SHARD_ENV, "TRAINMON_SHARD": str(shard)},
                flags=("-remoteWrite.label=scraper=vmagent", f"-remoteWrite.label=shard={shard}",
                       "-remoteWrite.flushInterval=200ms"),
            ))
            agent_config = sharding.scraper_config(
                "dcgm", engine="prometheus-agent", shards=SHARDS, shard=shard,
                remote_write=engine.write_url,
            )
            agent_config["global"].update(
                scrape_interval="1s", scrape_timeout="1s",
                external_labels={"scraper": "prometheus-agent", "shard": str(shard)},
            )
            workdir = tmp_path / f"agent-{shard}"
            workdir.mkdir()
            shutil.copytree(fleet_targets, workdir / "targets")
            processes.append(PrometheusAgent(workdir).start(agent_config))

        def scraped() -> dict[tuple[str, str], list[str]]:
            """(scraper, node) → the shards whose `up` reached VictoriaMetrics."""
            shards: dict[tuple[str, str], list[str]] = {}
            for series in engine.query('last_over_time(up{job="trainmon"}[1m])'):
                labels = series["metric"]
                shards.setdefault((labels["scraper"], labels["node"]), []).append(labels["shard"])
            return shards

        wait_until(lambda: len(scraped()) == 2 * len(NODES), 40,
                   "every node's up from both shard sets")
        # Three scrape rounds of every series: a second shard taking a node shows by then.
        def fewest_samples() -> float:
            result = engine.query('min(count_over_time(up{job="trainmon"}[1m]))')
            return float(result[0]["value"][1]) if result else 0.0

        wait_until(lambda: fewest_samples() >= 3, 15, "three scrapes of every node")
        split = scraped()
        for scraper, predict in (("vmagent", sharding.vmagent_shard),
                                 ("prometheus-agent", sharding.prometheus_shard)):
            taken = {node: split[(scraper, node)] for node in NODES}
            assert all(len(shards) == 1 for shards in taken.values()), taken
            assert {node: int(shards[0]) for node, shards in taken.items()} == {
                node: predict(node, SHARDS) for node in NODES
            }, scraper
            assert set(Counter(shards[0] for shards in taken.values())) == {"0", "1", "2"}
        # The two hashes split the nodes differently: a shard set is one kind of scraper.
        assert any(sharding.vmagent_shard(node, SHARDS) != sharding.prometheus_shard(node, SHARDS)
                   for node in NODES)
    finally:
        for process in reversed(processes):
            process.stop()
