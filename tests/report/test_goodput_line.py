"""The goodput line of ``trainmon doctor`` under a job's verdict, in both languages,
from the run ledger's series in a daemon's exposition."""

from __future__ import annotations

from trainmon.diagnosis.measure import MEASURED_SAMPLES, JobGoodput, measure
from trainmon.diagnosis.samples import ScrapedSamples, Window
from trainmon.report.render import goodput_line


def test_the_line_names_the_goodput_and_the_largest_loss_in_both_languages() -> None:
    goodput = JobGoodput("llm", ratio=0.42, largest_loss="data_wait", largest_loss_share=0.38)
    assert goodput_line(goodput, "en") == (
        "      goodput 42 % of its GPU time over 10 min; its largest loss since the daemon "
        "started: data_wait (38 %)")
    assert goodput_line(goodput, "zh") == (
        "      近 10 分钟有效训练占其 GPU 时间的 42 %；守护进程启动以来最大的损失：data_wait（38 %）")
    assert goodput_line(JobGoodput("llm", ratio=0.9), "en") == (
        "      goodput 90 % of its GPU time over 10 min")
    assert goodput_line(JobGoodput("llm", ratio=None), "en") is None
    assert goodput_line(None, "zh") is None


def test_the_largest_loss_is_read_from_the_ledgers_counters() -> None:
    exposition = """\
# TYPE trainmon_job_gpu_seconds_total counter
trainmon_job_gpu_seconds_total{job="llm",bucket="productive"} 60
trainmon_job_gpu_seconds_total{job="llm",bucket="data_wait"} 30
trainmon_job_gpu_seconds_total{job="llm",bucket="checkpoint"} 10
trainmon_job_gpu_seconds_total{job="llm",bucket="stalled"} 0
# TYPE trainmon_job_goodput_ratio gauge
trainmon_job_goodput_ratio{job="llm"} 0.55
"""
    window = Window([ScrapedSamples.from_text(exposition, at=1.0, wall=1.0,
                                              names=MEASURED_SAMPLES)])
    assert measure(window).goodput == (JobGoodput("llm", 0.55, "data_wait", 0.3),)
