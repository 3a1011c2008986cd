"""Run descriptions: the ``"type": "run"`` line, from the client's ``Reporter`` to the
daemon's parser — run ids, config hashing and redaction, environment, versions, git,
limits, hostile input, and secrets that must never reach the wire or the logs."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from testkit.exposition import scrape
from trainmon.client import Reporter
from trainmon.client.run import (
    RunDescriber,
    absolute_data_paths,
    capture_environment,
    capture_versions,
    flatten_settings,
    git_commit,
    resolve_run_id,
)
from trainmon.collectors.training import TrainingCollector
from trainmon.training.protocol import (
    MAX_LINE_BYTES,
    REDACTED,
    RunDescription,
    StepReport,
    config_hash,
    decode_payload,
    encode_report,
    is_secret_name,
    parse,
    parse_report,
)

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"
SECRETS = ("s3cr3t-xyz", "hf_Secr3tValue", "pa55w0rd-q", "ghp-urlpass")


def description_line(**changes: object) -> dict[str, object]:
    line: dict[str, object] = {
        "v": 1, "type": "run", "job": "resnet50", "rank": 0, "reporter_id": "9f2c4e1a7b3d5c60",
        "run": "20261201T101500Z-1a2b3c4d", "started": 1_796_120_100.5, "world_size": 8,
        "config_hash": "sha256:0123456789abcdef",
        "config": {"lr": 0.1, "model.layers": 12, "amp": True, "note": None, "opt": "adamw"},
        "environment": {"NCCL_IB_DISABLE": "0", "OMP_NUM_THREADS": "8"},
        "data_paths": ["/mnt/cfs/imagenet"],
        "versions": {"python": "3.11.7", "trainmon": "0.1.0", "torch": "2.3.0"},
        "git": {"commit": COMMIT, "dirty": None}, "host": "gpu-node-3",
        "framework": {"precision": "bf16-mixed", "batch_size": 64},
    }
    line.update(changes)
    return line


def parsed(line: dict[str, object]) -> StepReport | RunDescription:
    return parse(json.dumps(line).encode())


# -- protocol: the daemon's side -------------------------------------------------


def test_a_run_description_parses_with_every_field() -> None:
    description = parsed(description_line(ended="finished"))
    assert description == RunDescription(
        job="resnet50", rank=0, reporter_id="9f2c4e1a7b3d5c60",
        run="20261201T101500Z-1a2b3c4d", started=1_796_120_100.5, world_size=8,
        config_hash="sha256:0123456789abcdef",
        config={"lr": 0.1, "model.layers": 12, "amp": True, "note": None, "opt": "adamw"},
        environment={"NCCL_IB_DISABLE": "0", "OMP_NUM_THREADS": "8"},
        data_paths=("/mnt/cfs/imagenet",),
        versions={"python": "3.11.7", "trainmon": "0.1.0", "torch": "2.3.0"},
        git_commit=COMMIT, git_dirty=None, host="gpu-node-3",
        framework={"precision": "bf16-mixed", "batch_size": 64}, ended="finished",
    )


def test_the_documented_example_is_valid_and_its_hash_is_right() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    start = text.index('{"v":1,"type":"run"')
    example = "".join(text[start:text.index("```", start)].split("\n")).strip()
    description = parse(example.encode())
    assert isinstance(description, RunDescription)
    assert description.config_hash == config_hash(dict(description.config))
    assert config_hash({}) in text  # the hash of an empty config, as documented


def test_optional_description_fields_default_to_empty() -> None:
    line = {key: value for key, value in description_line().items() if key in (
        "v", "type", "job", "rank", "reporter_id", "run", "started", "config_hash")}
    description = parsed(line)
    assert isinstance(description, RunDescription)
    assert (description.world_size, description.config, description.environment,
            description.data_paths, description.versions, description.git_commit,
            description.host, description.framework, description.ended) == (
        None, {}, {}, (), {}, None, "", {}, None)


def test_step_lines_carry_an_optional_run_and_keep_parsing() -> None:
    step = {"v": 1, "job": "j", "rank": 0, "reporter_id": "ab", "steps": 0, "samples": 0,
            "step_seconds": 0, "data_wait_seconds": 0, "step_buckets": [0] * 15}
    assert parse_report(json.dumps(step).encode()).run is None
    assert parse_report(json.dumps({**step, "run": "slurm-42.1"}).encode()).run == "slurm-42.1"
    assert isinstance(parsed({**step, "type": "step"}), StepReport)
    with pytest.raises(Exception, match="invalid_label"):
        parse_report(json.dumps({**step, "run": "a b"}).encode())
    with pytest.raises(Exception, match="invalid_field: a run description"):
        parse_report(json.dumps(description_line()).encode())
    with pytest.raises(Exception, match="invalid_field: unknown type"):
        parsed({**step, "type": "gossip"})


def test_decode_payload_yields_descriptions_beside_reports() -> None:
    step = {"v": 1, "job": "j", "rank": 0, "reporter_id": "ab", "steps": 0, "samples": 0,
            "step_seconds": 0, "data_wait_seconds": 0, "step_buckets": [0] * 15}
    payload = encode_report(description_line()) + encode_report(step) + b'{"v":1,"type":9}\n'
    kinds = [type(item).__name__ for item in decode_payload(payload)]
    assert kinds == ["RunDescription", "StepReport", "ReportError"]


TOO_MANY = {f"k{index}": index for index in range(65)}


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"run": "has space"}, "invalid_label"),
        ({"run": "x" * 65}, "invalid_label"),
        ({"run": None}, "invalid_label"),
        ({"job": "a b"}, "invalid_label"),
        ({"rank": 8}, "invalid_field"),                       # >= world_size
        ({"rank": "0"}, "invalid_field"),
        ({"reporter_id": "no spaces"}, "invalid_field"),
        ({"started": -1}, "invalid_field"),
        ({"started": 1e999}, "invalid_field"),               # overflows to infinity
        ({"world_size": 0}, "invalid_field"),
        ({"config_hash": "md5:0123"}, "invalid_field"),
        ({"config_hash": None}, "invalid_field"),
        ({"config": []}, "invalid_field"),
        ({"config": TOO_MANY}, "invalid_field"),
        ({"config": {"k" * 129: 1}}, "invalid_label"),
        ({"config": {"bad key": 1}}, "invalid_label"),
        ({"config": {"k": "v" * 257}}, "invalid_field"),
        ({"config": {"k": 1e999}}, "invalid_field"),
        ({"config": {"k": 2**60}}, "invalid_field"),
        ({"config": {"k": [1, 2]}}, "invalid_field"),
        ({"config": {"k": {"nested": 1}}}, "invalid_field"),
        ({"config": {"k": "line\nbreak"}}, "invalid_field"),
        ({"config": {"k": "\ud800"}}, "invalid_field"),        # a lone surrogate
        ({"framework": {"k": "\u0085"}}, "invalid_field"),
        ({"environment": {"1BAD": "x"}}, "invalid_label"),
        ({"environment": {"NCCL_X": 1}}, "invalid_field"),
        ({"environment": {f"NCCL_{index}": "1" for index in range(65)}}, "invalid_field"),
        ({"data_paths": "/mnt/data"}, "invalid_field"),
        ({"data_paths": ["relative/data"]}, "invalid_field"),
        ({"data_paths": [f"/d{index}" for index in range(9)]}, "invalid_field"),
        ({"data_paths": ["/d\x00x"]}, "invalid_field"),
        ({"versions": {"torch": 2}}, "invalid_field"),
        ({"versions": {"bad name": "1"}}, "invalid_label"),
        ({"versions": {f"m{index}": "1" for index in range(17)}}, "invalid_field"),
        ({"git": "0123"}, "invalid_field"),
        ({"git": {"commit": "XYZ", "dirty": None}}, "invalid_field"),
        ({"git": {"commit": COMMIT, "dirty": "no"}}, "invalid_field"),
        ({"host": "node 3"}, "invalid_field"),
        ({"ended": "lost"}, "invalid_field"),  # the daemon concludes lost; no client says it
        ({"v": 2}, "unsupported_version"),
    ],
)
def test_hostile_descriptions_are_refused_with_their_reason(
    changes: dict[str, object], reason: str
) -> None:
    items = list(decode_payload(json.dumps(description_line(**changes)).encode()))
    assert len(items) == 1
    assert not isinstance(items[0], (RunDescription, StepReport)), items[0]
    assert items[0].reason == reason, items[0]


def test_oversized_and_non_finite_description_lines_are_refused() -> None:
    line = json.dumps(description_line(host="h" * 200)).encode()
    big = line[:-1] + b',"pad":"' + b"x" * MAX_LINE_BYTES + b'"}'
    (error,) = decode_payload(big)
    assert getattr(error, "reason", None) == "too_large"
    nan = json.dumps(description_line()).replace('"lr": 0.1', '"lr": NaN').encode()
    (error,) = decode_payload(nan)
    assert getattr(error, "reason", None) == "invalid_field"


def test_the_daemon_redacts_secrets_a_foreign_client_sent() -> None:
    description = parsed(description_line(
        config={"api_key": "s3cr3t-xyz", "db.Password": "pa55w0rd-q", "lr": 0.1,
                "repo": "https://user:ghp-urlpass@github.com/x.git"},
        environment={"NCCL_IB_TOKEN": "s3cr3t-xyz", "NCCL_IB_HCA": "mlx5"},
        framework={"hub_token": "hf_Secr3tValue"},
    ))
    assert isinstance(description, RunDescription)
    assert description.config == {"api_key": REDACTED, "db.Password": REDACTED, "lr": 0.1,
                                  "repo": f"https://{REDACTED}@github.com/x.git"}
    assert description.environment == {"NCCL_IB_TOKEN": REDACTED, "NCCL_IB_HCA": "mlx5"}
    assert description.framework == {"hub_token": REDACTED}
    assert not any(secret in repr(description) for secret in SECRETS)


@pytest.mark.parametrize(
    ("name", "secret"),
    [("HF_TOKEN", True), ("aws_secret_access_key", True), ("db.password", True),
     ("NCCL_IB_AUTH", True), ("passwd", True), ("gcp.credentials.file", True),
     ("lr", False), ("NCCL_IB_DISABLE", False), ("batch_size", False),
     ("tokenizer", True)],  # broad on purpose: false positives cost little
)
def test_is_secret_name(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_config_hash_is_canonical_json_and_order_free() -> None:
    empty = "sha256:" + hashlib.sha256(b"{}").hexdigest()[:16]
    assert config_hash({}) == empty
    assert config_hash({"b": 1, "a": "x"}) == config_hash({"a": "x", "b": 1})
    expected = hashlib.sha256(b'{"a":"x","b":1}').hexdigest()[:16]
    assert config_hash({"b": 1, "a": "x"}) == f"sha256:{expected}"
    assert config_hash({"a": 1}) != config_hash({"a": 2})


# -- the client: run id, config, environment, versions, git ------------------------


@pytest.mark.parametrize(
    ("run", "environ", "expected"),
    [
        ("mine", {"TRAINMON_RUN_ID": "env", "SLURM_JOB_ID": "7"}, "mine"),
        (None, {"TRAINMON_RUN_ID": "env", "TORCHELASTIC_RUN_ID": "te", "SLURM_JOB_ID": "7"},
         "env"),
        (None, {"TORCHELASTIC_RUN_ID": "te-1", "SLURM_JOB_ID": "7"}, "te-1"),
        (None, {"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "7"}, "7"),
        (None, {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "2"}, "7.2"),
        (None, {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0"}, "7"),
        # torchrun --max-restarts keeps its run id: each restart is a run of its own
        (None, {"TORCHELASTIC_RUN_ID": "te-1", "TORCHELASTIC_RESTART_COUNT": "0"}, "te-1"),
        (None, {"TORCHELASTIC_RUN_ID": "te-1", "TORCHELASTIC_RESTART_COUNT": "3"}, "te-1.3"),
        ("exp 7/a", {}, "exp_7_a"),
        ("r" * 80, {}, "r" * 64),
    ],
)
def test_run_id_resolution(run: str | None, environ: dict[str, str], expected: str) -> None:
    assert resolve_run_id(run, environ, 0.0) == expected


def test_without_a_launcher_each_process_gets_a_timestamped_run_id() -> None:
    started = 1_796_120_100.0  # 2026-12-01T10:15:00Z
    first, second = (resolve_run_id(None, {}, started) for _ in range(2))
    assert first.startswith("20261201T101500Z-") and len(first) == 17 + 8
    assert first != second


def test_config_is_flattened_redacted_and_hashed_in_full() -> None:
    class Odd:
        def __str__(self) -> str:
            raise RuntimeError("no")

    flat = flatten_settings({
        "optimizer": {"name": "adamw", "betas": [0.9, 0.95], "eps": float("nan")},
        "lr schedule": "cosine", "hf_token": "hf_Secr3tValue", "odd": Odd(), "big": 2**60,
        "path": Path("/data"), "empty": {},
    })
    assert flat == {
        "optimizer.name": "adamw", "optimizer.betas": "[0.9,0.95]", "optimizer.eps": "nan",
        "lr_schedule": "cosine", "hf_token": REDACTED, "odd": "<Odd>",
        "big": str(2**60), "path": "/data", "empty": "{}",
    }
    many = {f"opt{index:03}": "v" * 10 for index in range(99)}
    many["opt000"] = "v" * 300
    described = RunDescriber(job="j", rank=0, reporter_id="ab", world_size=1, run="r",
                             started=0.0, environ={}, config=many).description()
    config = described["config"]
    assert isinstance(config, dict) and len(config) == 64 and "opt063" in config
    assert config["opt000"] == "v" * 255 + "…"
    changed = RunDescriber(job="j", rank=0, reporter_id="ab", world_size=1, run="r",
                           started=0.0, environ={}, config={**many, "opt098": "w"})
    assert described["config_hash"] != changed.config_hash  # a key past the 64 still counts
    assert described["config_hash"] == config_hash(flatten_settings(many))


def test_namespaces_dataclasses_and_unreadable_configs(caplog: pytest.LogCaptureFixture) -> None:
    import argparse
    import dataclasses

    @dataclasses.dataclass
    class Hyper:
        lr: float = 0.1
        api_key: str = SECRETS[0]

    class Broken(dict):  # type: ignore[type-arg]
        def items(self) -> object:
            raise KeyError(SECRETS[0])

    assert flatten_settings(argparse.Namespace(lr=0.1, epochs=3)) == {"lr": 0.1, "epochs": 3}
    assert flatten_settings(Hyper()) == {"lr": 0.1, "api_key": REDACTED}
    assert flatten_settings(Broken(a=1)) == {"config": "<unreadable Broken>"}
    assert flatten_settings(42) == {"config": 42}
    assert SECRETS[0] not in caplog.text
    assert absolute_data_paths("/mnt/cfs/train") == ("/mnt/cfs/train",)
    assert absolute_data_paths(7) == ()  # type: ignore[arg-type]


def test_a_description_that_cannot_be_built_costs_only_the_description(
    listener: Listener, caplog: pytest.LogCaptureFixture,
) -> None:
    class Hostile(Mapping[str, str]):
        """An environment whose copy fails every time, with a secret in the error."""

        def __getitem__(self, name: str) -> str:
            raise KeyError(name)

        def __len__(self) -> int:
            return 0

        def __iter__(self) -> Iterator[str]:
            raise ValueError(SECRETS[0])

    endpoint, drain = listener.endpoint, listener.drain
    reporter = Reporter("unit", endpoint=endpoint, environ=Hostile(), interval_seconds=0.05)
    reporter.step(samples=3)
    items = listener.until(StepReport)  # sent by the sender thread
    reporter.close()
    items += items_of(drain())
    assert not any(isinstance(item, RunDescription) for item in items)
    assert [item.samples for item in items if isinstance(item, StepReport)][-1] == 3
    assert "cannot build the run description (ValueError)" in caplog.text
    assert SECRETS[0] not in caplog.text


def test_the_line_fits_16_kib_whatever_the_config() -> None:
    wide = {f"{'k' * 120}{index}": "\u00e9" * 256 for index in range(64)}
    describer = RunDescriber(job="j", rank=0, reporter_id="ab", world_size=1, run="r",
                             started=0.0, environ={f"NCCL_{i}": "x" * 256 for i in range(64)},
                             config=wide)
    describer.update(framework=wide)
    line = describer.line()
    assert len(line) - 1 <= MAX_LINE_BYTES
    description = parse(line.rstrip(b"\n"))
    assert isinstance(description, RunDescription)
    assert 0 < len(description.config) < 64
    assert description.config_hash == config_hash(flatten_settings(wide))


def test_environment_capture_keeps_the_steering_variables() -> None:
    environ = {
        "NCCL_IB_DISABLE": "1", "NCCL_IB_TOKEN": "s3cr3t-xyz", "TORCH_DISTRIBUTED_DEBUG": "INFO",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "CUDA_VISIBLE_DEVICES": "0,1",
        "OMP_NUM_THREADS": "4", "HOME": "/root", "TORCHELASTIC_RUN_ID": "x", "NCCL_BAD\n": "x",
        "NCCL_LONG": "y" * 300, "NCCL_CTRL": "a\x1bb",
    }
    environment = capture_environment(environ)
    assert environment == {
        "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_CTRL": "a?b", "NCCL_IB_DISABLE": "1",
        "NCCL_IB_TOKEN": REDACTED, "NCCL_LONG": "y" * 255 + "…", "OMP_NUM_THREADS": "4",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TORCH_DISTRIBUTED_DEBUG": "INFO",
    }


def test_versions_read_torch_only_when_the_program_imported_it() -> None:
    code = ("import sys; from trainmon.client.run import capture_versions; "
            "v = capture_versions(); print(sorted(v), 'torch' in sys.modules)")
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60).stdout
    assert output.strip() == "['python', 'trainmon'] False"
    torch = pytest.importorskip("torch")
    versions = capture_versions()
    assert versions["torch"] == str(torch.__version__)
    assert ("cuda" in versions) == (torch.version.cuda is not None)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_git_commit_from_loose_and_packed_refs_worktrees_and_detached_heads(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    write(repo / ".git" / "HEAD", "ref: refs/heads/main\n")
    write(repo / ".git" / "refs" / "heads" / "main", COMMIT + "\n")
    (repo / "src" / "deep").mkdir(parents=True)
    assert git_commit(str(repo / "src" / "deep")) == COMMIT
    (repo / ".git" / "refs" / "heads" / "main").unlink()
    write(repo / ".git" / "packed-refs",
          f"# pack-refs with: peeled\n{OTHER} refs/heads/dev\n{COMMIT} refs/heads/main\n")
    assert git_commit(str(repo)) == COMMIT
    # A linked worktree: .git is a file; HEAD is its own, branches in the common dir.
    write(repo / ".git" / "worktrees" / "wt" / "HEAD", "ref: refs/heads/dev\n")
    write(repo / ".git" / "worktrees" / "wt" / "commondir", "../..\n")
    write(tmp_path / "wt" / ".git", f"gitdir: {repo / '.git' / 'worktrees' / 'wt'}\n")
    assert git_commit(str(tmp_path / "wt")) == OTHER
    write(repo / ".git" / "HEAD", OTHER + "\n")  # detached
    assert git_commit(str(repo)) == OTHER
    write(repo / ".git" / "HEAD", "ref: refs/heads/unborn\n")
    assert git_commit(str(repo)) is None
    write(repo / ".git" / "HEAD", "ref: refs/../../etc/passwd\n")
    assert git_commit(str(repo)) is None
    write(repo / ".git" / "HEAD", "x" * 5000)  # over the size bound
    assert git_commit(str(repo)) is None
    (tmp_path / "plain").mkdir()
    assert git_commit(str(tmp_path / "plain")) in (None, git_commit(str(tmp_path)))


def test_git_commit_of_this_checkout_matches_git() -> None:
    git = shutil.which("git")
    checkout = Path(__file__).resolve().parents[2]
    if git is None or not (checkout / ".git").exists():
        pytest.skip("needs git and a git checkout")
    head = subprocess.run([git, "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True, timeout=30).stdout.strip()
    assert git_commit(str(checkout / "tests" / "training")) == head


def test_data_paths_are_absolute_deduplicated_and_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    paths = absolute_data_paths(["data", tmp_path / "data", "/x\ny", *(f"/d{i}" for i in range(9))])
    assert paths == (str(tmp_path / "data"), *(f"/d{i}" for i in range(7)))
    assert "control characters" in caplog.text and "only the first 8" in caplog.text


def test_descriptions_are_due_first_on_change_every_minute_and_back_off() -> None:
    now = [100.0]
    describer = RunDescriber(job="j", rank=0, reporter_id="ab", world_size=1, run="r",
                             started=0.0, environ={}, clock=lambda: now[0])
    assert describer.due()
    describer.sent(True)
    assert not describer.due()
    describer.update(config={})  # nothing changed
    assert not describer.due()
    describer.update(framework={"precision": "bf16"})
    assert describer.due()
    describer.line()
    describer.update(framework={"precision": "fp16"})  # while that line is in flight
    describer.sent(True)
    assert describer.due()  # the change goes out at the next tick, not a minute later
    describer.line()
    describer.sent(True)
    now[0] += 59.0
    assert not describer.due()
    now[0] += 1.0
    assert describer.due()
    waits = []
    for _ in range(8):
        describer.sent(False)
        started = now[0]
        while not describer.due():
            now[0] += 0.5
        waits.append(now[0] - started)
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]


# -- the Reporter end to end --------------------------------------------------------


class Listener:
    """A unix datagram socket standing in for the daemon."""

    #: Longest wait for an awaited datagram (a bound, not a pace: it ends at arrival).
    WAIT_SECONDS = 10.0

    def __init__(self, path: Path) -> None:
        self.endpoint = f"unix://{path}"
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind(str(path))

    def drain(self) -> list[bytes]:
        """Every datagram queued now and within 0.3 s of silence."""
        self._socket.settimeout(0.3)
        payloads = []
        while True:
            try:
                payloads.append(self._socket.recv(70_000))
            except TimeoutError:
                return payloads

    def until(self, kind: type[StepReport | RunDescription] = RunDescription,
              ) -> list[StepReport | RunDescription]:
        """The items of the datagrams up to the next one holding a ``kind`` item."""
        self._socket.settimeout(self.WAIT_SECONDS)
        items: list[StepReport | RunDescription] = []
        while not any(isinstance(item, kind) for item in items):
            items += items_of([self.receive()])  # TimeoutError fails the test
        return items

    def receive(self) -> bytes:
        """The next datagram."""
        self._socket.settimeout(self.WAIT_SECONDS)
        return self._socket.recv(70_000)

    def close(self) -> None:
        self._socket.close()


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Listener]:
    receiver = Listener(tmp_path / "steps.sock")
    yield receiver
    receiver.close()


def items_of(payloads: list[bytes]) -> list[StepReport | RunDescription]:
    items = [item for payload in payloads for item in decode_payload(payload)]
    assert all(isinstance(item, (StepReport, RunDescription)) for item in items), items
    return items  # type: ignore[return-value]


def test_reporter_describes_its_run_at_start_on_change_and_at_the_end(
    listener: Listener, tmp_path: Path,
) -> None:
    environ = {"RANK": "1", "WORLD_SIZE": "4", "TRAINMON_RUN_ID": "exp-42",
               "NCCL_IB_DISABLE": "1"}
    reporter = Reporter("unit", endpoint=listener.endpoint, environ=environ,
                        interval_seconds=0.05, config={"lr": 0.1, "model": {"depth": 50}},
                        data_paths=[tmp_path / "train"])
    reporter.step(samples=8)
    items = listener.until()  # the start, with a step report
    reporter.describe(config={"lr": 0.2}, data_paths=["/mnt/cfs/val"],
                      framework={"precision": "bf16"})
    items += listener.until()  # the change, with a step report
    reporter.close()
    items += items_of(listener.drain())
    descriptions = [item for item in items if isinstance(item, RunDescription)]
    steps = [item for item in items if isinstance(item, StepReport)]
    assert len(descriptions) == 3  # start, after describe(), the end
    first, changed, last = descriptions
    assert items[0] == first  # before the first step report
    assert (first.job, first.rank, first.world_size, first.run) == ("unit", 1, 4, "exp-42")
    assert first.reporter_id == reporter.reporter_id and first.started == reporter.started
    assert first.config == {"lr": 0.1, "model.depth": 50}
    assert first.config_hash == config_hash({"lr": 0.1, "model.depth": 50})
    assert first.environment == {"NCCL_IB_DISABLE": "1"}
    assert first.data_paths == (str(tmp_path / "train"),)
    assert first.versions["python"] and first.host
    assert changed.config == {"lr": 0.2, "model.depth": 50}
    assert changed.config_hash == reporter.config_hash != first.config_hash
    assert changed.data_paths == (str(tmp_path / "train"), "/mnt/cfs/val")
    assert changed.framework == {"precision": "bf16"}
    assert (first.ended, changed.ended, last.ended) == (None, None, "finished")
    assert items[-1] == last and steps[-1].steps == 1
    assert {step.run for step in steps} == {"exp-42"}
    assert reporter.dropped_reports == 0


def test_an_exception_ends_the_run_crashed(
    listener: Listener,
) -> None:
    endpoint, drain = listener.endpoint, listener.drain
    with pytest.raises(RuntimeError), Reporter("unit", endpoint=endpoint, environ={}) as reporter:
        reporter.step()
        raise RuntimeError("diverged")
    descriptions = [item for item in items_of(drain()) if isinstance(item, RunDescription)]
    assert [description.ended for description in descriptions] == ["crashed"]


def test_a_crashing_script_marks_its_run_crashed(
    listener: Listener,
) -> None:
    endpoint, drain = listener.endpoint, listener.drain
    code = ("import trainmon.client as c; "
            f"r = c.Reporter('unit', endpoint={endpoint!r}, interval_seconds=60); "
            "r.step(); raise SystemError('crash')")
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60,
                   env={**os.environ, "TRAINMON_RUN_ID": "crash-1"})
    descriptions = [item for item in items_of(drain()) if isinstance(item, RunDescription)]
    assert [(d.run, d.ended) for d in descriptions] == [("crash-1", "crashed")]


def test_no_secret_reaches_the_wire_or_the_logs(
    listener: Listener, caplog: pytest.LogCaptureFixture,
) -> None:
    endpoint, drain = listener.endpoint, listener.drain
    caplog.set_level(logging.DEBUG)
    environ = {"NCCL_IB_TOKEN": SECRETS[0], "TORCH_HUB_SECRET": SECRETS[1],
               "CUDA_PASSWORD_FILE": SECRETS[2], "NCCL_SOCKET_IFNAME": "eth0"}
    reporter = Reporter(
        "unit", endpoint=endpoint, environ=environ, interval_seconds=0.05,
        config={"hf_token": SECRETS[1], "db": {"password": SECRETS[2]},
                "repo": f"https://bot:{SECRETS[3]}@github.com/x.git",
                "wandb_api_key": SECRETS[0], "lr": 0.1},
    )
    reporter.describe(framework={"hub_token": SECRETS[1], "tokens": [SECRETS[0]]},
                      config={"AWS_SECRET_ACCESS_KEY": SECRETS[0]})
    reporter.step()
    payloads = [listener.receive()]  # the sender thread's first: the description and a report
    reporter.close()
    payloads += drain()
    wire = b"".join(payloads)
    assert b'"type":"run"' in wire and b"NCCL_SOCKET_IFNAME" in wire
    for secret in SECRETS:
        assert secret.encode() not in wire
        assert secret not in caplog.text
        assert secret not in json.dumps(reporter.run_description())
    (description, *_) = (item for item in items_of(payloads) if isinstance(item, RunDescription))
    assert description.environment["NCCL_IB_TOKEN"] == REDACTED
    assert description.config["repo"] == f"https://{REDACTED}@github.com/x.git"


URL_SECRET = "Wr0ngKeySecr3t"


def test_url_credentials_never_reach_the_wire_from_any_field(
    listener: Listener, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.chdir(tmp_path)
    framework = types.ModuleType("deepspeed")  # a framework the program imported
    framework.__dict__["__version__"] = f"0.14+https://ci:{URL_SECRET}@pypi.example"
    monkeypatch.setitem(sys.modules, "deepspeed", framework)
    reporter = Reporter(
        f"https://bot:{URL_SECRET}@jobs.example/unit", endpoint=listener.endpoint,
        environ={"NCCL_DEBUG_FILE": f"s3://AKIAXXXX:{URL_SECRET}@logs/nccl"},
        interval_seconds=60,
        config={f"mirror.s3://AKIAXXXX:{URL_SECRET}@bucket": 1},
        data_paths=[f"s3://AKIAXXXX:{URL_SECRET}@bucket/data",
                    f"hdfs://user:{URL_SECRET}@namenode:8020/train",
                    f"s3://AKIAXXXX:{URL_SECRET}@bucket/" + "x\n"],  # refused: logged
    )
    reporter.describe(framework={"hub": f"https://u:{URL_SECRET}@hub.example"},
                      data_paths=[f"gs://k:{URL_SECRET}@bucket/val"])
    reporter.step()
    reporter.close()
    payloads = listener.drain()
    wire = b"".join(payloads)
    assert b'"type":"run"' in wire
    assert URL_SECRET.encode() not in wire
    assert URL_SECRET not in caplog.text
    assert URL_SECRET not in json.dumps(reporter.run_description())
    description = [item for item in items_of(payloads) if isinstance(item, RunDescription)][-1]
    assert description.data_paths[0] == f"{tmp_path}/s3:/{REDACTED}@bucket/data"
    assert all(REDACTED in path for path in description.data_paths)
    assert description.versions["deepspeed"] == f"0.14+https://{REDACTED}@pypi.example"
    assert description.environment["NCCL_DEBUG_FILE"] == f"s3://{REDACTED}@logs/nccl"


def test_describe_never_raises_and_step_stays_untouched(
    listener: Listener,
) -> None:
    endpoint, drain = listener.endpoint, listener.drain
    reporter = Reporter("unit", endpoint=endpoint, environ={}, interval_seconds=60)
    reporter.describe(config={1: object(), "deep": {"a": {"b": {"c": 1}}}},
                      data_paths=[b"/bytes/path", None])  # type: ignore[list-item]
    reporter.step()
    reporter.close()
    descriptions = [item for item in items_of(drain()) if isinstance(item, RunDescription)]
    assert descriptions[-1].config["deep.a.b.c"] == 1
    assert "1" in descriptions[-1].config


def test_the_daemon_exports_the_run_it_was_told(
    make_collector: Callable[..., TrainingCollector], socket_path: Path,
) -> None:
    collector = make_collector(socket=socket_path)
    environ = {"TRAINMON_RUN_ID": "exp-7", "RANK": "0", "WORLD_SIZE": "1"}
    reporter = Reporter("unit", endpoint=f"unix://{socket_path}", environ=environ,
                        interval_seconds=0.05, config={"lr": 0.1})
    reporter.step(samples=2)
    deadline = time.monotonic() + 5
    labels = {"job": "unit", "run": "exp-7", "config_hash": reporter.config_hash}
    while scrape(collector).value("trainmon_training_run_info", **labels) != 1:
        assert time.monotonic() < deadline, scrape(collector).text
        time.sleep(0.05)
    reporter.close()


# -- framework callbacks fill in what they know ---------------------------------------


def test_lightning_callback_describes_the_trainer(
    listener: Listener, tmp_path: Path,
) -> None:
    torch = pytest.importorskip("torch")
    lightning = pytest.importorskip("lightning.pytorch")
    from trainmon.client.lightning import TrainmonCallback

    class Regression(lightning.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self, lr: float, hf_token: str) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch: object, batch_idx: int) -> object:
            x, y = batch  # type: ignore[misc]
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> object:
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    endpoint, drain = listener.endpoint, listener.drain
    data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    callback = TrainmonCallback("pl", endpoint=endpoint, run="pl-run-1",
                                config={"dataset": "synthetic"})
    trainer = lightning.Trainer(
        max_epochs=2, accelerator="cpu", devices=1, callbacks=[callback], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path, accumulate_grad_batches=2,
    )
    trainer.fit(Regression(lr=0.05, hf_token=SECRETS[1]), loader)
    payloads = drain()
    assert SECRETS[1].encode() not in b"".join(payloads)
    descriptions = [item for item in items_of(payloads) if isinstance(item, RunDescription)]
    last = descriptions[-1]
    assert (last.run, last.ended, last.config) == ("pl-run-1", "finished", {"dataset": "synthetic"})
    framework = dict(last.framework)
    assert framework["name"] == "lightning" and framework["precision"] in ("32-true", "32")
    assert (framework["max_epochs"], framework["accumulate_grad_batches"],
            framework["batch_size"], framework["hparams.lr"], framework["hparams.hf_token"]) == (
        2, 2, 4, 0.05, REDACTED)
    assert framework["strategy"] == "SingleDeviceStrategy"
    assert {"torch", "lightning"} <= set(last.versions)


def test_lightning_exception_ends_the_run_crashed(
    listener: Listener, tmp_path: Path,
) -> None:
    torch = pytest.importorskip("torch")
    lightning = pytest.importorskip("lightning.pytorch")
    from trainmon.client.lightning import TrainmonCallback

    class Diverging(lightning.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch: object, batch_idx: int) -> object:
            raise FloatingPointError("loss is NaN")

        def configure_optimizers(self) -> object:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    endpoint, drain = listener.endpoint, listener.drain
    data = torch.utils.data.TensorDataset(torch.randn(8, 8), torch.randn(8, 1))
    trainer = lightning.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, logger=False,
        callbacks=[TrainmonCallback("pl", endpoint=endpoint)], enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )
    with pytest.raises(FloatingPointError):
        trainer.fit(Diverging(), torch.utils.data.DataLoader(data, batch_size=4))
    descriptions = [item for item in items_of(drain()) if isinstance(item, RunDescription)]
    assert [description.ended for description in descriptions][-1] == "crashed"
    assert all(description.ended is None for description in descriptions[:-1])


def test_transformers_callback_describes_the_training_arguments(
    listener: Listener, tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from testkit.tiny_trainer import Pairs, Regression
    from trainmon.client.transformers import TrainmonCallback

    endpoint, drain = listener.endpoint, listener.drain
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2,
        max_steps=3, learning_rate=3e-4, seed=7, report_to=[], use_cpu=True,
        save_strategy="no", logging_strategy="no", disable_tqdm=True,
        hub_token=SECRETS[1],
    )
    callback = TrainmonCallback("hf", endpoint=endpoint, run="hf-run-1")
    transformers.Trainer(model=Regression(), args=args, train_dataset=Pairs(64),
                         callbacks=[callback]).train()
    payloads = drain()
    assert SECRETS[1].encode() not in b"".join(payloads)
    descriptions = [item for item in items_of(payloads) if isinstance(item, RunDescription)]
    last = descriptions[-1]
    assert (last.run, last.ended) == ("hf-run-1", "finished")
    framework = dict(last.framework)
    assert (framework["name"], framework["batch_size"], framework["learning_rate"],
            framework["max_steps"], framework["seed"], framework["precision"]) == (
        "transformers", 8, 3e-4, 3, 7, "fp32")
    assert {"torch", "transformers"} <= set(last.versions)
