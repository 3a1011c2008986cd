"""``trainmon runs``: each run's goodput and its largest loss, from its ledger summary."""

from __future__ import annotations

from trainmon.runs.render import goodput_text, largest_loss_text


def test_the_goodput_and_the_largest_loss_of_a_run() -> None:
    summary = {"goodput_ratio": 0.62,
               "gpu_seconds": {"productive": 62.0, "data_wait": 31.0, "checkpoint": 7.0,
                               "stalled": 0.0}}
    assert goodput_text(summary) == "62%"
    assert largest_loss_text(summary) == "data_wait 31%"


def test_a_run_recorded_before_goodput_existed_shows_dashes() -> None:
    assert goodput_text({}) == "-"
    assert largest_loss_text({}) == "-"
    assert largest_loss_text({"gpu_seconds": {"productive": 10.0}}) == "-"
