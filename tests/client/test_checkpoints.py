"""Checkpoints: the protocol fields, the client's ``checkpoint()``, the daemon's
counters and the storage a checkpoint lands on (issue 15, item 5).

The daemon side runs a real ``TrainingCollector`` over the checked-in tree
``tests/node/fixtures/mounts`` (a host table and a container's own table);
the end-to-end tests save real ``torch.save`` checkpoints into a temporary
folder and send through the real unix socket, then read the exposition text.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.exposition import Scrape, scrape
from tests.training.training_support import FakeClock, line, push, report
from trainmon.client import Reporter
from trainmon.collectors.training import TrainingCollector, TrainingConfig
from trainmon.node.mounts import find_mount, parse_mountinfo
from trainmon.training.protocol import MAX_LINE_BYTES, ReportError, parse_report
from trainmon.training.writers import uid_writer

TREE = Path(__file__).parents[1] / "node" / "fixtures" / "mounts"
WALL_NOW = 1_700_000_100.0
RANK0 = {"job": "resnet50", "rank": "0"}

Make = Callable[..., TrainingCollector]


@pytest.fixture
def make(clock: FakeClock) -> Iterator[Make]:
    """``make(proc_root=..., sys_root=..., socket=...)``: a started collector."""
    started: list[TrainingCollector] = []

    def build(
        proc_root: Path = TREE / "proc", sys_root: Path = TREE / "sys",
        socket: Path | None = None,
    ) -> TrainingCollector:
        collector = TrainingCollector(
            TrainingConfig(socket=socket), clock=clock, wall_clock=lambda: WALL_NOW,
            proc_root=proc_root, sys_root=sys_root,
        )
        collector.start()
        started.append(collector)
        return collector

    yield build
    for collector in started:
        collector.stop()


#: The owner of the jobs ``send`` pushes: from loopback, by this test's own user.
OWNER = uid_writer(os.geteuid())


def send(collector: TrainingCollector, **changes: object) -> None:
    response = collector.handle_push(push(line(**changes)))
    assert response.status == 200, response.body


def checkpointed(count: int, seconds: float, path: str | None = "/mnt/cfs/run1/ckpt.pt",
                 when: float = 1_700_000_050.0, **changes: object) -> dict[str, object]:
    fields: dict[str, object] = {"checkpoints": count, "checkpoint_seconds": seconds,
                                 "last_checkpoint_time": when, **changes}
    if path is not None:
        fields["checkpoint_path"] = path
    return fields


# -- protocol -------------------------------------------------------------------


def parse(**changes: object) -> object:
    return parse_report(json.dumps(report(**changes)).encode())


def test_protocol_accepts_the_checkpoint_fields() -> None:
    parsed = parse_report(line(**checkpointed(3, 12.5, path="/mnt/cfs/run 1/é/step-3.pt")))
    assert (parsed.checkpoints, parsed.checkpoint_seconds) == (3, 12.5)
    assert parsed.last_checkpoint_time == 1_700_000_050.0
    assert parsed.checkpoint_path == "/mnt/cfs/run 1/é/step-3.pt"


def test_protocol_fields_are_optional_and_unknown_is_not_zero() -> None:
    plain = parse_report(line())
    assert (plain.checkpoints, plain.checkpoint_seconds, plain.checkpoint_path) == (
        None, None, None)
    started = parse_report(line(checkpoints=0))  # the job checkpoints, none done yet
    assert (started.checkpoints, started.checkpoint_seconds) == (0, 0.0)


def test_a_path_of_4096_bytes_fits_in_a_line() -> None:
    path = "/" + "é" * 2047 + "x"  # 4096 bytes of UTF-8
    assert len(path.encode()) == 4096
    encoded = line(**checkpointed(1, 1.0, path=path))
    assert len(encoded) < MAX_LINE_BYTES
    assert parse_report(encoded.rstrip(b"\n")).checkpoint_path == path


@pytest.mark.parametrize(
    "changes",
    [
        {"checkpoints": -1},
        {"checkpoints": 1.5},
        {"checkpoints": True},
        {"checkpoints": "3"},
        {"checkpoints": 2**53 + 1},
        {"checkpoints": 1, "checkpoint_seconds": -0.1},
        {"checkpoints": 1, "checkpoint_seconds": "1"},
        {"checkpoints": 1, "checkpoint_seconds": 1e300 * 10},  # written as Infinity
        {"checkpoint_seconds": 1.0},  # seconds without a count
        {"last_checkpoint_time": 1.0},
        {"checkpoint_path": "/a.pt"},
        {"checkpoints": 0, "checkpoint_path": "/a.pt"},  # no checkpoint has no path
        {"checkpoints": 0, "last_checkpoint_time": 1.0},
        {"checkpoints": 1, "last_checkpoint_time": -5},
        {"checkpoints": 1, "checkpoint_path": "ckpt/step-1.pt"},
        {"checkpoints": 1, "checkpoint_path": ""},
        {"checkpoints": 1, "checkpoint_path": 7},
        {"checkpoints": 1, "checkpoint_path": ["/a"]},
        {"checkpoints": 1, "checkpoint_path": "/a\x00b"},
        {"checkpoints": 1, "checkpoint_path": "/a\nb"},
        {"checkpoints": 1, "checkpoint_path": "/a\x1b[31mred"},
        {"checkpoints": 1, "checkpoint_path": "/a\x85b"},
        {"checkpoints": 1, "checkpoint_path": "/a\x7f"},
        {"checkpoints": 1, "checkpoint_path": "/" + "a" * 4096},
        {"checkpoints": 1, "checkpoint_path": "/" + "é" * 2048},
    ],
)
def test_protocol_rejects_hostile_checkpoint_fields(changes: dict[str, object]) -> None:
    encoded = json.dumps(report(**changes), allow_nan=True).encode()
    with pytest.raises(ReportError) as error:
        parse_report(encoded)
    assert error.value.reason == "invalid_field"


@pytest.mark.parametrize(
    "text",
    [
        b'"checkpoints":1,"checkpoint_seconds":NaN',
        b'"checkpoints":1,"checkpoint_seconds":Infinity',
        b'"checkpoints":1,"checkpoint_seconds":1e999',
        b'"checkpoints":1,"checkpoint_path":"/a\\ud800b"',  # a lone surrogate
        b'"checkpoints":1,"checkpoint_path":"/a\\u0000b"',
    ],
)
def test_protocol_rejects_hostile_json(text: bytes) -> None:
    encoded = line().rstrip(b"}\n") + b"," + text + b"}"
    with pytest.raises(ReportError) as error:
        parse_report(encoded)
    assert error.value.reason == "invalid_field"


def test_a_rejected_report_is_counted_and_changes_nothing(make: Make) -> None:
    collector = make()
    send(collector, **checkpointed(1, 2.0))
    response = collector.handle_push(push(line(**checkpointed(2, 3.0, path="/a\x00"))))
    assert response.status == 400
    result = scrape(collector)
    assert result.value("trainmon_training_checkpoints_total", **RANK0) == 1
    assert result.value("trainmon_training_rejected_reports_total",
                        reason="invalid_field") == 1


# -- daemon: counters, last checkpoint, storage ---------------------------------


def test_counters_grow_by_the_increase_and_survive_restarts(make: Make) -> None:
    collector = make()
    send(collector, **checkpointed(1, 4.0))
    send(collector, **checkpointed(1, 4.0))  # repeated: nothing added
    send(collector, **checkpointed(3, 10.0))
    send(collector)  # a report without checkpoint fields neither resets nor adds
    send(collector, **checkpointed(4, 12.0))
    result = scrape(collector)
    assert result.value("trainmon_training_checkpoints_total", **RANK0) == 4
    assert result.value("trainmon_training_checkpoint_seconds_total", **RANK0) == 12.0
    assert result.value("trainmon_training_reporter_resets_total", **RANK0) == 0
    send(collector, reporter_id="restarted", **checkpointed(1, 5.0))  # a new process
    result = scrape(collector)
    assert result.value("trainmon_training_checkpoints_total", **RANK0) == 5
    assert result.value("trainmon_training_checkpoint_seconds_total", **RANK0) == 17.0


def test_last_checkpoint_duration_is_the_increase_of_the_advancing_report(make: Make) -> None:
    collector = make()
    send(collector, **checkpointed(1, 4.0))
    assert scrape(collector).value(
        "trainmon_training_last_checkpoint_duration_seconds", job="resnet50") == 4.0
    send(collector, **checkpointed(3, 10.0, when=1_700_000_060.0))  # two saves: their mean
    result = scrape(collector)
    assert result.value("trainmon_training_last_checkpoint_duration_seconds",
                        job="resnet50") == 3.0
    assert result.value("trainmon_training_last_checkpoint_timestamp_seconds",
                        job="resnet50") == 1_700_000_060.0
    send(collector, **checkpointed(3, 10.0, when=1_700_000_099.0))  # not advanced: kept
    assert scrape(collector).value(
        "trainmon_training_last_checkpoint_timestamp_seconds", job="resnet50") == 1_700_000_060.0


def test_last_checkpoint_time_is_clamped_and_maxed_over_ranks(make: Make) -> None:
    collector = make()
    send(collector, pid=None, **checkpointed(1, 1.0, when=1_700_000_010.0))
    send(collector, rank=1, reporter_id="rank1", pid=None, **checkpointed(
        2, 6.0, path="/data/run1/r1.pt", when=1_700_000_030.0))
    send(collector, rank=2, reporter_id="rank2", world_size=8)  # no checkpoints
    result = scrape(collector)
    assert result.value("trainmon_training_last_checkpoint_timestamp_seconds",
                        job="resnet50") == 1_700_000_030.0
    assert result.value("trainmon_training_last_checkpoint_duration_seconds",
                        job="resnet50") == 3.0
    assert result.value("trainmon_training_checkpoints_total", job="resnet50", rank="2") is None
    # the latest checkpoint's path decides the storage
    assert result.labelsets("trainmon_training_checkpoint_storage_info") == [
        {"job": "resnet50", "owner": OWNER, "mountpoint": "/data", "fstype": "xfs", "storage": "local_disk"}]
    send(collector, job="future", **checkpointed(1, 1.0, when=WALL_NOW + 3600))
    assert scrape(collector).value(
        "trainmon_training_last_checkpoint_timestamp_seconds", job="future") == WALL_NOW


def test_no_checkpoint_fields_no_checkpoint_series(make: Make) -> None:
    collector = make()
    send(collector)
    send(collector, rank=1, reporter_id="rank1", checkpoints=0)
    result = scrape(collector)
    assert result.value("trainmon_training_checkpoints_total", **RANK0) is None
    assert result.value("trainmon_training_checkpoints_total", job="resnet50", rank="1") == 0
    for name in ("trainmon_training_last_checkpoint_timestamp_seconds",
                 "trainmon_training_last_checkpoint_duration_seconds",
                 "trainmon_training_checkpoint_storage_info"):
        assert result.labelsets(name) == []


@pytest.mark.parametrize(
    ("path", "pid", "expected"),
    [
        # pid 4242's root has no /mnt/cfs/run1: the pid is not the reporter's (another
        # pid namespace); the host sees the path, so the host's table tells
        ("/mnt/cfs/run1/step-1.pt", 4242, ("/mnt/cfs", "nfs4", "network_fs")),
        ("/mnt/cos/elsewhere/step-1.pt", 4242, ("", "", "unknown")),  # nobody sees it
        ("/tmp/step-1.pt", 4242, ("/", "overlay", "ephemeral")),
        ("/checkpoints/step-1.pt", 4242, ("/checkpoints", "nfs4", "network_fs")),
        ("/workspace/step-1.pt", 4242, ("/workspace", "ext4", "cloud_disk")),
        ("/mnt/cfs/run1/step-1.pt", 99, ("/mnt/cfs", "nfs4", "network_fs")),  # host table
        ("/mnt/cos/run1/step-1.pt", None, ("/mnt/cos", "fuse.cosfs", "object_store")),
        ("/dev/shm/step-1.pt", None, ("/dev/shm", "tmpfs", "ephemeral")),
        ("/data/run1/step-1.pt", None, ("/data", "xfs", "local_disk")),
        ("/mnt/cbs/run1/step-1.pt", None, ("/mnt/cbs", "ext4", "cloud_disk")),
    ],
)
def test_storage_of_the_checkpoint_path(
    make: Make, path: str, pid: int | None, expected: tuple[str, str, str]
) -> None:
    collector = make()
    send(collector, pid=pid, **checkpointed(1, 1.0, path=path))
    mountpoint, fstype, storage = expected
    assert scrape(collector).labelsets("trainmon_training_checkpoint_storage_info") == [
        {"job": "resnet50", "owner": OWNER, "mountpoint": mountpoint, "fstype": fstype, "storage": storage}]


def test_storage_unknown_without_a_mount_table(make: Make, tmp_path: Path) -> None:
    collector = make(proc_root=tmp_path / "proc", sys_root=tmp_path / "sys")
    send(collector, **checkpointed(1, 1.0))
    assert scrape(collector).labelsets("trainmon_training_checkpoint_storage_info") == [
        {"job": "resnet50", "owner": OWNER, "mountpoint": "", "fstype": "", "storage": "unknown"}]


def test_unreadable_sysfs_gives_unknown_not_a_failed_scrape(make: Make, tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    sys_root = tmp_path / "sys"
    (sys_root / "dev" / "block").mkdir(parents=True)
    (sys_root / "dev" / "block").chmod(0)
    try:
        collector = make(sys_root=sys_root)
        send(collector, **checkpointed(1, 1.0, path="/data/x.pt"))
        storage = scrape(collector).labelsets("trainmon_training_checkpoint_storage_info")
    finally:
        (sys_root / "dev" / "block").chmod(0o755)
    assert storage[0]["storage"] == "unknown"


# -- client -----------------------------------------------------------------------


def test_checkpoint_context_records_a_successful_save(tmp_path: Path) -> None:
    with Reporter("ckpt", endpoint=f"unix://{tmp_path}/none.sock", environ={}) as reporter:
        assert "checkpoints" not in reporter.report()
        before = time.time()
        with reporter.checkpoint(tmp_path / "step-1.pt"):
            time.sleep(0.02)
        sent = reporter.report()
        assert sent["checkpoints"] == 1
        assert isinstance(sent["checkpoint_seconds"], float)
        assert 0.02 <= sent["checkpoint_seconds"] < 1.0
        assert before <= sent["last_checkpoint_time"] <= time.time()  # type: ignore[operator]
        assert sent["checkpoint_path"] == str(tmp_path / "step-1.pt")
        reporter.step()
        assert reporter.report()["phase_seconds"] == {"checkpoint": sent["checkpoint_seconds"]}
        parse_report(json.dumps(reporter.report()).encode())  # valid protocol


def test_checkpoint_context_on_failure_counts_only_the_phase(tmp_path: Path) -> None:
    with Reporter("ckpt", endpoint=f"unix://{tmp_path}/none.sock", environ={}) as reporter:
        with pytest.raises(OSError, match="disk full"), reporter.checkpoint("/x/step-1.pt"):
            time.sleep(0.01)
            raise OSError("disk full")
        sent = reporter.report()
        assert (sent["checkpoints"], sent["checkpoint_seconds"]) == (0, 0.0)
        assert "checkpoint_path" not in sent and "last_checkpoint_time" not in sent
        reporter.step()
        phases = reporter.report()["phase_seconds"]
        assert isinstance(phases, dict) and phases["checkpoint"] >= 0.01
        parse_report(json.dumps(reporter.report()).encode())


def test_checkpoint_saved_relative_and_unsendable_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with Reporter("ckpt", endpoint=f"unix://{tmp_path}/none.sock", environ={}) as reporter:
        reporter.checkpoint_saved("out/../ckpt/step-2.pt", 1.5)
        assert reporter.report()["checkpoint_path"] == str(tmp_path / "ckpt" / "step-2.pt")
        reporter.checkpoint_saved("/" + "a" * 5000, float("nan"))  # both unsendable
        reporter.checkpoint_saved("/bad\nname", -1.0)
        sent = reporter.report()
        assert (sent["checkpoints"], sent["checkpoint_seconds"]) == (3, 1.5)
        assert "checkpoint_path" not in sent
        parse_report(json.dumps(sent).encode())


def test_real_torch_save_through_the_socket(
    make: Make, socket_path: Path, tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    collector = make(proc_root=Path("/proc"), sys_root=Path("/sys"), socket=socket_path)
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    model = torch.nn.Linear(64, 64)
    with Reporter("torch-job", endpoint=f"unix://{socket_path}", environ={}) as reporter:
        for step in range(3):
            reporter.step(samples=8)
            with reporter.checkpoint(folder / f"step-{step}.pt"):
                torch.save(model.state_dict(), folder / f"step-{step}.pt")
        with pytest.raises(RuntimeError), reporter.checkpoint(folder / "missing" / "x.pt"):
            torch.save(model.state_dict(), folder / "missing" / "x.pt")  # no such folder
    assert sorted(path.name for path in folder.iterdir()) == [
        "step-0.pt", "step-1.pt", "step-2.pt"]
    result = wait_for(collector, "trainmon_training_checkpoints_total", 3.0)
    rank = {"job": "torch-job", "rank": "0"}
    seconds = result.value("trainmon_training_checkpoint_seconds_total", **rank)
    phase = result.value("trainmon_training_phase_seconds_total", phase="checkpoint", **rank)
    assert seconds is not None and phase is not None and 0 < seconds < phase
    last = result.value("trainmon_training_last_checkpoint_timestamp_seconds", job="torch-job")
    assert last == WALL_NOW  # the daemon's (fake) clock bounds it
    [storage] = result.labelsets("trainmon_training_checkpoint_storage_info")
    # the mount of the folder, found independently through this process's own table
    table = parse_mountinfo(Path(f"/proc/{os.getpid()}/mountinfo").read_text())
    mount = find_mount(table.mounts, str(folder / "step-2.pt"))
    assert mount is not None
    assert (storage["mountpoint"], storage["fstype"]) == (mount.mountpoint, mount.fstype)
    assert storage["storage"] in ("local_disk", "cloud_disk", "network_fs", "object_store",
                                  "ephemeral", "unknown")


def test_checkpoint_called_without_with_records_an_untimed_save_and_warns_once(
    make: Make, socket_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    torch = pytest.importorskip("torch")
    collector = make(proc_root=Path("/proc"), sys_root=Path("/sys"), socket=socket_path)
    model = torch.nn.Linear(8, 8)
    with Reporter("torch-job", endpoint=f"unix://{socket_path}", environ={},
                  interval_seconds=60) as reporter:
        for step in range(2):
            reporter.step(samples=8)
            torch.save(model.state_dict(), tmp_path / f"step-{step}.pt")
            before = time.time()
            reporter.checkpoint(tmp_path / f"step-{step}.pt")  # the README's mistake
            sent = reporter.report()
            assert sent["checkpoints"] == step + 1 and sent["checkpoint_seconds"] == 0.0
            assert before <= sent["last_checkpoint_time"] <= time.time()  # type: ignore[operator]
            assert sent["checkpoint_path"] == str(tmp_path / f"step-{step}.pt")
    hints = [record for record in caplog.records if "not used with `with`" in record.getMessage()]
    assert len(hints) == 1 and "with reporter.checkpoint(path)" in hints[0].getMessage()
    wait_for(collector, "trainmon_training_checkpoints_total", 2.0)


def test_a_checkpoint_entered_later_or_failing_counts_once_or_not_at_all(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    with Reporter("ckpt", endpoint=f"unix://{tmp_path}/none.sock", environ={}) as reporter:
        saving = reporter.checkpoint(tmp_path / "step-1.pt")  # kept, then entered
        assert reporter.report()["checkpoints"] == 0
        with saving:
            pass
        del saving
        with pytest.raises(OSError), reporter.checkpoint(tmp_path / "step-2.pt"):
            raise OSError("disk full")
        assert reporter.report()["checkpoints"] == 1
    assert not [record for record in caplog.records if "`with`" in record.getMessage()]


def wait_for(collector: TrainingCollector, name: str, value: float) -> Scrape:
    deadline = time.monotonic() + 10
    while True:
        result = scrape(collector)
        if result.value(name, job="torch-job", rank="0") == value:
            return result
        assert time.monotonic() < deadline, result.text
        time.sleep(0.05)


# -- framework callbacks ------------------------------------------------------------


def test_lightning_callback_reports_model_checkpoint_saves(
    make: Make, socket_path: Path, tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    lightning = pytest.importorskip("lightning.pytorch")
    from trainmon.client.lightning import TrainmonCallback

    class Regression(lightning.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch: object, batch_idx: int) -> object:
            x, y = batch  # type: ignore[misc]
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> object:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    collector = make(proc_root=Path("/proc"), sys_root=Path("/sys"), socket=socket_path)
    data = torch.utils.data.TensorDataset(torch.randn(40, 8), torch.randn(40, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    folder = tmp_path / "ckpts"
    checkpoints = lightning.callbacks.ModelCheckpoint(
        dirpath=folder, every_n_train_steps=5, save_top_k=-1)
    callback = TrainmonCallback("pl-ckpt", endpoint=f"unix://{socket_path}")
    trainer = lightning.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, callbacks=[callback, checkpoints],
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(Regression(), loader)
    saved = sorted(folder.iterdir())
    assert len(saved) == 2  # steps 5 and 10
    result = wait_until(collector, "pl-ckpt", 2)
    [storage] = result.labelsets("trainmon_training_checkpoint_storage_info")
    table = parse_mountinfo(Path(f"/proc/{os.getpid()}/mountinfo").read_text())
    mount = find_mount(table.mounts, str(saved[-1]))
    assert mount is not None and storage["mountpoint"] == mount.mountpoint
    assert "save_checkpoint" not in vars(trainer)  # unwrapped at the end of training


def test_transformers_callback_reports_trainer_saves(
    make: Make, socket_path: Path, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from testkit.tiny_trainer import Pairs, Regression
    from trainmon.client.transformers import TrainmonCallback

    collector = make(proc_root=Path("/proc"), sys_root=Path("/sys"), socket=socket_path)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=10,
        report_to=[], use_cpu=True, save_strategy="steps", save_steps=5,
        logging_strategy="no", dataloader_num_workers=0, disable_tqdm=True,
    )
    callback = TrainmonCallback("hf-ckpt", endpoint=f"unix://{socket_path}")
    trainer = transformers.Trainer(model=Regression(), args=args, train_dataset=Pairs(40),
                                   callbacks=[callback])
    trainer.train()
    assert (tmp_path / "out" / "checkpoint-10").is_dir()
    result = wait_until(collector, "hf-ckpt", 2)
    seconds = result.value("trainmon_training_checkpoint_seconds_total", job="hf-ckpt", rank="0")
    assert seconds is not None and seconds > 0
    assert result.value("trainmon_training_phase_seconds_total", job="hf-ckpt", rank="0",
                        phase="checkpoint") == pytest.approx(seconds)


def wait_until(collector: TrainingCollector, job: str, checkpoints: int) -> Scrape:
    deadline = time.monotonic() + 10
    while True:
        result = scrape(collector)
        if result.value("trainmon_training_checkpoints_total", job=job, rank="0") == checkpoints:
            return result
        assert time.monotonic() < deadline, result.text
        time.sleep(0.05)
