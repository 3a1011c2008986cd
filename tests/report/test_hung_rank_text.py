"""``doctor``'s words for a hung job: the rank that holds it, each rank's place, the next
step by where it is, in en and zh."""

from __future__ import annotations

from trainmon.report.messages import advice_text, finding_text, hung_rank_lines

VALUES: dict[str, object] = {
    "rank": "1", "where": "data_loader", "frame": "dataset.py:42 __getitem__", "phase": "",
    "waiting": "0", "collective": "all_reduce", "seq": "311", "seconds": 47.0,
    "ranks": "1|data_loader|||dataset.py:42 __getitem__|47;"
             "0|collective|all_reduce|311|graph.py:825 _engine_run_backward|46",
}


def test_the_holding_rank_its_frame_and_the_waiting_ranks_in_both_languages() -> None:
    assert finding_text("hung_rank", VALUES, "en") == (
        "rank 1 holds the job: it is in its data loader's next() → dataset.py:42 "
        "__getitem__; rank(s) 0 wait in all_reduce #311 for 47 s")
    zh = finding_text("hung_rank", VALUES, "zh")
    assert "rank 1 拖住了整个任务" in zh and "all_reduce #311" in zh


def test_each_rank_gets_a_line() -> None:
    assert hung_rank_lines(VALUES, "en") == [
        "rank 1: in its data loader's next() → dataset.py:42 __getitem__, 47 s",
        "rank 0: in a collective all_reduce #311 → graph.py:825 _engine_run_backward, 46 s",
    ]
    gone = {**VALUES, "where": "gone", "ranks": "1|gone||||35"}
    assert hung_rank_lines(gone, "en") == ["rank 1: gone, silent for 35 s"]
    assert finding_text("hung_rank", gone, "en").startswith("rank 1 is gone")


def test_the_next_step_follows_where_the_rank_is() -> None:
    assert "dead NFS/CFS mount" in advice_text("hung_rank", "en", VALUES)
    assert "py-spy dump" in advice_text("hung_rank", "en", {**VALUES, "where": "code"})
    assert "checkpoint" in advice_text("hung_rank", "en", {**VALUES, "where": "checkpoint"})
    assert "other nodes" in advice_text("hung_rank", "en", {**VALUES, "where": "elsewhere",
                                                           "rank": ""})
    assert "检查 rank 1 的数据输入" in advice_text("hung_rank", "zh", VALUES)
