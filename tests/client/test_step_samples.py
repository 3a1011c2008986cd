"""``step()`` without ``samples=``: the tracked batch's leading dimension
(``trainmon.client.batches``), explicit ``samples`` winning, and the warning for
``samples=len(batch)`` on a tuple batch (issue 23, item 2)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.exposition import scrape
from trainmon.client import Reporter
from trainmon.client.batches import samples_in, tuple_length_mistake
from trainmon.collectors.training import TrainingCollector

torch = pytest.importorskip("torch")
numpy = pytest.importorskip("numpy")

Make = Callable[..., TrainingCollector]


def offline(tmp_path: Path) -> Reporter:
    """A reporter whose reports go nowhere: the tests read ``report()``."""
    return Reporter("unit", endpoint=f"unix://{tmp_path}/none.sock", environ={},
                    interval_seconds=60)


class BrokenShape:
    """A lazy tensor whose shape cannot be read."""

    @property
    def shape(self) -> tuple[int, ...]:
        raise RuntimeError("not materialised")


def x_y(samples: int) -> tuple[object, object]:
    return torch.zeros(samples, 3, 8), torch.zeros(samples, dtype=torch.long)


@pytest.mark.parametrize(("batch", "expected"), [
    (torch.zeros(16, 3), 16),
    (numpy.zeros((7, 2)), 7),
    (x_y(16), 16),
    ([torch.zeros(5, 2), torch.zeros(5)], 5),
    ({"input_ids": torch.zeros(4, 128), "labels": torch.zeros(4)}, 4),
    ((["a cat", "a dog", "a cow"], torch.zeros(3)), 3),  # the first tensor, not the first item
    (((torch.zeros(6, 2), torch.zeros(6, 2)), torch.zeros(6)), 6),  # nested inputs
    ({"inputs": {"ids": torch.zeros(9, 4)}, "label": torch.zeros(9)}, 9),
    ({"input_ids": [[1, 2], [3, 4], [5, 6]]}, 3),  # a tokenizer's lists: rows
    ([1, 2, 3, 4], 4),  # a list of samples
    (["a", "b"], 2),
    (torch.tensor(3.0), 0),  # 0-d: no leading dimension
    (None, 0),
    ("a string", 0),
    (object(), 0),
    (BrokenShape(), 0),  # never raises into step()
    ((BrokenShape(), torch.zeros(2)), 0),
    ((), 0),
])
def test_the_leading_dimension_rule(batch: object, expected: int) -> None:
    assert samples_in(batch) == expected


def test_the_tuple_length_mistake() -> None:
    assert tuple_length_mistake(x_y(16), 2)
    assert tuple_length_mistake({"input_ids": torch.zeros(4, 9)}, 1)
    assert not tuple_length_mistake(x_y(16), 16)  # the right count
    assert not tuple_length_mistake(x_y(2), 2)  # two samples: nothing to tell
    assert not tuple_length_mistake(torch.zeros(16, 3), 16)  # len() of a tensor is right
    assert not tuple_length_mistake([1, 2, 3], 3)


def test_tracked_xy_batches_reach_the_daemon_counted_by_their_leading_dimension(
    make_collector: Make, socket_path: Path,
) -> None:
    collector = make_collector(socket=socket_path)
    data = torch.utils.data.TensorDataset(torch.randn(100, 8), torch.randn(100, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=16)  # 6 × 16 and a last 4
    with Reporter("unit", endpoint=f"unix://{socket_path}", environ={},
                  interval_seconds=60) as reporter:
        for x, _y in reporter.track(loader):
            x.sum()
            reporter.step()
    deadline = time.monotonic() + 10
    labels = {"job": "unit", "rank": "0"}
    while scrape(collector).value("trainmon_training_steps_total", **labels) != 7:
        assert time.monotonic() < deadline, scrape(collector).text
        time.sleep(0.02)
    assert scrape(collector).value("trainmon_training_samples_total", **labels) == 100


def test_a_dict_batch_counts_its_first_tensor(tmp_path: Path) -> None:
    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 10

        def __getitem__(self, index: int) -> dict[str, object]:
            return {"input_ids": torch.zeros(32, dtype=torch.long), "labels": index}

    reporter = offline(tmp_path)
    for _batch in reporter.track(torch.utils.data.DataLoader(Tokens(), batch_size=4)):
        reporter.step()
    assert (reporter.report()["steps"], reporter.report()["samples"]) == (3, 10)
    reporter.close()


def test_explicit_samples_win_and_nothing_tracked_counts_nothing(tmp_path: Path) -> None:
    reporter = offline(tmp_path)
    reporter.step()  # no track(): 0, as before
    for _batch in reporter.track([x_y(16), x_y(16)]):
        reporter.step(samples=10)
    reporter.step()  # the batch was counted (explicitly) already
    assert reporter.report()["samples"] == 20
    reporter.close()


def test_several_batches_per_step_all_count(tmp_path: Path) -> None:
    reporter = offline(tmp_path)
    for index, _batch in enumerate(reporter.track([x_y(8)] * 7 + [x_y(3)])):
        if index % 4 == 3:  # gradient accumulation: one step every 4 micro-batches
            reporter.step()
    assert (reporter.report()["steps"], reporter.report()["samples"]) == (2, 7 * 8 + 3)
    reporter.close()


def test_samples_len_batch_of_a_tuple_is_warned_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trainmon.client.reporter")
    reporter = offline(tmp_path)
    for batch in reporter.track([x_y(16)] * 3):
        reporter.step(samples=len(batch))
    assert reporter.report()["samples"] == 6  # explicit wins, even when wrong
    warnings = [record.getMessage() for record in caplog.records if "step(samples=" in
                record.getMessage()]
    assert len(warnings) == 1
    assert "step(samples=2) counts the 2 items of the tuple batch, not its 16 samples" in \
        warnings[0]
    right = offline(tmp_path)
    for _x, y in right.track([x_y(16)] * 2):
        right.step(samples=len(y))
    assert right.report()["samples"] == 32
    assert len([r for r in caplog.records if "step(samples=" in r.getMessage()]) == 1
    reporter.close()
    right.close()
