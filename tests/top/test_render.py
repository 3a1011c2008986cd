"""``trainmon top``'s screen as text: a simulated node's exposition read as ``top`` reads
a daemon (``top_support``), its view rendered at 80×24, 60×20 and 40×10, in English
and Chinese, with the marks, the held GPUs, the detail view and a source that fails."""

from __future__ import annotations

import pytest

from tests.top.top_support import SimulatedJob, SimulatedNode, demo_like, view
from trainmon.diagnosis.samples import ScrapedSamples
from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.top.model import MARK_HOLD_SECONDS, TOP_SAMPLES, Recorder
from trainmon.top.render import ScreenState, cells, line_text, render


def screen(state: ScreenState | None = None, width: int = 80, height: int = 24,
           node: SimulatedNode | None = None) -> list[str]:
    state = state or ScreenState()
    shown = view(node or demo_like(), 14)
    assert shown.wall is not None
    lines = [line_text(line) for line in render(shown, state, width, height,
                                                now=shown.wall + 1)]
    assert len(lines) == height
    assert all(cells(line) <= width for line in lines), "\n".join(lines)
    return lines


def rank_line(lines: list[str], job: str, rank: str) -> str:
    """The line of ``rank`` among the lines after ``job``'s."""
    start = next(index for index, line in enumerate(lines) if f" {job}  " in line)
    return next(line for line in lines[start + 1:] if line.split()[:1] == [rank])


def test_80x24_shows_every_job_with_its_verdict_ranks_marks_and_held_gpus() -> None:
    lines = screen()
    text = "\n".join(lines)
    assert lines[0].startswith("trainmon top · http://127.0.0.1:19400/metrics")
    assert "window 10 s" in lines[0]
    assert lines[1].split() == ["RANK", "GPU", "STEP", "SMP/S", "WAIT", "COMM", "UTIL", "SM",
                                "MEM", "FOUND"]
    assert "healthy  SCHEDULING  goodput 77%  rank 3 needs" in text
    assert "starved  SCHEDULING  goodput 45%  rank 0 holds the job" in text
    assert rank_line(lines, "healthy", "3").split()[1:] == [
        "6", "0.700s", "45.7", "7%", "14%", "95%", "70%", "75%", "STRAGGLER", "×1.57"]
    assert rank_line(lines, "healthy", "0").split()[1:] == [
        "3", "0.700s", "45.7", "7%", "43%", "95%", "70%", "75%"]
    assert rank_line(lines, "starved", "0").endswith("HUNG loader 11s")
    assert rank_line(lines, "starved", "1").endswith("stalled loader 11s")
    assert "GPU 7 held by pid:900 (pid 900): idle" in text
    assert lines[-1] == "q quit  s sort:rank  r reverse  / filter  m marked only  ↑↓↵ job  l 中文"


@pytest.mark.parametrize(("width", "height", "headings"), [
    (60, 20, ["RANK", "STEP", "SMP/S", "WAIT", "COMM", "UTIL", "FOUND"]),
    (40, 10, ["RANK", "STEP", "WAIT", "FOUND"]),
])
def test_narrow_terminals_drop_columns_and_keep_the_marks(
        width: int, height: int, headings: list[str]) -> None:
    lines = screen(width=width, height=height)
    assert lines[1].split() == headings
    assert rank_line(lines, "healthy", "3").endswith("STRAGGLER ×1.57")
    assert lines[-1].startswith("q quit")


def test_the_selected_job_is_shown_when_the_lines_do_not_fit() -> None:
    lines = screen(ScreenState(selected="starved"), 40, 10)
    assert "▸ starved" in lines[2]
    assert rank_line(lines, "starved", "0").endswith("HUNG loader 11s")


def test_chinese_uses_doctor_words_and_counts_wide_characters_as_two_cells() -> None:
    lines = screen(ScreenState(lang="zh"))
    text = "\n".join(lines)
    assert lines[1].split() == ["RANK", "GPU", "步长", "样本/秒", "等数据", "通信", "利用率",
                                "SM", "显存", "发现"]
    assert "healthy  调（调度）  有效产出 77%  rank 3 每步的计算时间" in text
    assert rank_line(lines, "starved", "0").endswith("卡住 数据加载 11s")
    assert rank_line(lines, "healthy", "3").endswith("拖慢 ×1.57")
    assert "GPU 7 被 pid:900（进程 900）占用：空闲" in text
    assert lines[-1].startswith("q 退出")
    assert max(cells(line) for line in screen(ScreenState(lang="zh"), 40, 10)) <= 40


def test_the_detail_view_gives_doctors_findings_next_step_and_each_rank() -> None:
    lines = screen(ScreenState(selected="healthy", detail=True), 80, 40)
    text = "\n".join(lines)
    assert lines[1].startswith("   healthy: SCHEDULING — rank 3 needs 1.57x the work time")
    assert "   next: " in text
    assert "goodput" not in lines[1]
    assert "   rank 1: GPU 4, STEP 0.700s, SMP/S 45.7, WAIT 7%, COMM 43%" in text
    assert "(by group: dp 40% tp 3%)" in text
    assert "— STRAGGLER ×1.57" in text
    assert lines[-1].startswith("↵/esc back")


def test_sorting_by_communication_puts_the_longest_wait_first_and_r_turns_it() -> None:
    node = SimulatedNode([SimulatedJob("mixed", gpus=[0, 1, 2], straggler=2,
                                       straggler_seconds=0.1)])
    lines = screen(ScreenState(sort="comm"), node=node)
    assert [line.split()[0] for line in lines[3:6]] == ["0", "1", "2"]
    lines = screen(ScreenState(sort="comm", reverse=True), node=node)
    assert [line.split()[0] for line in lines[3:6]] == ["2", "1", "0"]
    assert "sort:comm↑" in lines[-1]


def test_filter_and_marked_only_choose_what_is_shown() -> None:
    text = "\n".join(screen(ScreenState(filter="STARV")))
    assert "starved" in text and "healthy" not in text
    lines = screen(ScreenState(marked_only=True))
    healthy = [line for line in lines if line.strip().startswith(("0 ", "1 ", "2 ", "3 "))]
    assert len(healthy) == 4  # healthy's straggler, starved's three stalled ranks
    assert "no job matches the filter" in "\n".join(screen(ScreenState(filter="none")))


def test_a_mark_that_cleared_stays_dim_with_its_age_then_goes() -> None:
    node = demo_like()
    node.jobs[0].stall_until = 12
    recorder = Recorder(DiagnosisConfig(), {"kind": "url", "url": "test"})
    shown = view(node, 14, recorder)
    lines = [line_text(line) for line in render(shown, ScreenState(), 120, 24, shown.wall)]
    assert rank_line(lines, "starved", "0").endswith("was HUNG loader 8s 3s ago")
    styles = [style for line in render(shown, ScreenState(), 120, 24, shown.wall)
              for text, style in line if "HUNG" in text]
    assert styles == ["dim"]
    shown = view(node, int(MARK_HOLD_SECONDS) + 1, recorder)
    lines = [line_text(line) for line in render(shown, ScreenState(), 80, 24, shown.wall)]
    assert "HUNG" not in "\n".join(lines)


def test_a_source_that_fails_keeps_the_data_and_says_why_and_how_old() -> None:
    recorder = Recorder(DiagnosisConfig(), {"kind": "url", "url": "test"})
    shown = view(demo_like(), 10, recorder)
    failed = recorder.view(shown.source, "cannot read http://x/metrics: [Errno 111] refused")
    assert failed.wall is not None
    lines = [line_text(line) for line in render(failed, ScreenState(), 80, 24,
                                                now=failed.wall + 65)]
    assert lines[1].startswith("cannot read it: cannot read http://x/metrics: [Errno 111] "
                               "refused — showing")
    assert "showing data from 1m05s ago" in line_text(render(
        failed, ScreenState(), 200, 24, now=failed.wall + 65)[1])
    assert "healthy" in "\n".join(lines)
    empty = Recorder(DiagnosisConfig(), {"kind": "url", "url": "test"}).view("src", "refused")
    assert line_text(render(empty, ScreenState(), 80, 24)[1]) == "no data yet: refused"


def test_text_from_the_daemon_cannot_reach_the_terminal_as_escape_sequences() -> None:
    node = SimulatedNode([SimulatedJob("evil\x1b]0;owned\x07\x1b[2J", gpus=[0, 1])])
    lines = screen(node=node)
    assert not any("\x1b" in line or "\x07" in line for line in lines)
    assert "evil" in "\n".join(lines)


def test_a_terminal_too_small_says_so() -> None:
    shown = view(demo_like(), 4)
    assert [line_text(line) for line in render(shown, ScreenState(), 8, 2)] == ["termina…"]
    assert render(shown, ScreenState(), 0, 0) == []


def test_prometheus_snapshots_not_scraped_again_add_nothing() -> None:
    recorder = Recorder(DiagnosisConfig(), {"kind": "url", "url": "test"})
    text = demo_like().tick()
    assert recorder.add(ScrapedSamples.from_text(text, 10.0, 10.0, TOP_SAMPLES))
    assert not recorder.add(ScrapedSamples.from_text(text, 10.0, 10.0, TOP_SAMPLES))
    report = recorder.view("x").report
    assert report is not None and report.source.get("snapshots") == 1


def test_a_fail_slow_rank_and_a_gpu_a_job_holds_idle_are_shown() -> None:
    node = SimulatedNode([SimulatedJob("llm", gpus=[0, 1], fail_slow={1: ("compute", 0.12)})],
                         holders={5: 4000})  # rank 0's process also holds GPU 5, idle
    lines = screen(node=node)
    assert rank_line(lines, "llm", "1").endswith("fail-slow +12% compute")
    assert "GPU 5 held by llm (pid 4000): idle" in "\n".join(lines)
    assert rank_line(screen(ScreenState(lang="zh"), node=node), "llm", "1").endswith(
        "变慢 +12% compute")


def test_the_detail_view_wraps_to_a_narrow_terminal() -> None:
    lines = screen(ScreenState(selected="starved", detail=True, lang="zh"), 40, 10)
    assert lines[1] == "   starved: 调（调度） — rank 0"
    assert lines[2].startswith("      拖住了整个任务")
    lines = screen(ScreenState(selected="starved", detail=True, scroll=5), 40, 10)
    assert lines[-1].startswith("↵/esc back")


def test_snapshots_farther_apart_than_the_window_still_give_rates() -> None:
    recorder = Recorder(DiagnosisConfig(), {"kind": "url", "url": "test"})
    node = demo_like()
    for _ in range(4):  # a Prometheus scraping every 15 s
        for _ in range(15):
            text = node.tick()
        recorder.add(ScrapedSamples.from_text(text, node.wall(), node.wall(), TOP_SAMPLES))
    shown = recorder.view("prometheus")
    assert shown.report is not None and shown.report.source.get("seconds") == 30.0
    healthy = next(job for job in shown.jobs if job.job == "healthy")
    assert [row.samples_per_second for row in healthy.ranks] == [
        pytest.approx(32 / 0.7)] * 4


@pytest.mark.parametrize(("extra", "mark"), [(0.03, "slowest ×1.09"), (0.005, "")])
def test_the_slowest_rank_under_the_straggler_threshold_is_marked_beyond_jitter(
        extra: float, mark: str) -> None:
    node = SimulatedNode([SimulatedJob("llm", gpus=[0, 1, 2], straggler=2,
                                       straggler_seconds=extra)])
    lines = screen(node=node)
    assert rank_line(lines, "llm", "2").rstrip().endswith(f"75% {mark}".rstrip())
    assert "llm  COMPUTE" in "\n".join(lines)
