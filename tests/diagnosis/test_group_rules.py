"""The rules that read communication per process group (issue 34), on simulated samples:
pipeline bubbles, the rank missing from the collectives the others wait in, a rank
lost without a word whose peers then ended.

The node of ``test_rules`` (``Node``: ranks stepping at given per-step seconds), with
the per-group series the training collector exports added by hand.
"""

from __future__ import annotations

from testkit.exposition import Scrape
from tests.diagnosis.diagnosis_support import (
    Node,
    diagnosing,
    evaluated,
    findings,
    healthy_job,
    job_verdicts,
)
from trainmon.diagnosis.thresholds import DiagnosisConfig

GROUP_EXPOSED = "trainmon_training_group_comm_exposed_seconds_total"


def hung_rank(result: Scrape, job: str) -> str | None:
    return next((row["rank"] for row in result.labelsets("trainmon_diagnosis_finding_info")
                 if row["job"] == job and row["finding"] == "hung_rank"), None)


class PipelineNode(Node):
    """Two pipeline stages; each waits ``bubble`` of its step for the other (``pp``)."""

    bubble = 0.0

    def tick(self, seconds: float = 5.0) -> None:
        super().tick(seconds)
        for (job, rank), r in self.ranks.items():
            step = r.wait + r.work + r.comm
            self.source.add(GROUP_EXPOSED, seconds / step * r.comm, job=job, rank=rank,
                            group="pp")


def pipeline(bubble: float) -> PipelineNode:
    node = PipelineNode()
    healthy_job(node, "pp-job", ranks=2)
    for rank in node.ranks.values():
        rank.measured = True
        rank.comm = bubble * 0.3 / (1 - bubble)  # of a 0.3 s step with the wait
        rank.work = 0.3 - rank.wait
    return node


def test_a_pipeline_waiting_for_its_stages_has_bubbles_not_communication() -> None:
    result = pipeline(0.5).run()
    assert "pipeline_bubble" in findings(result, "pp-job")
    assert not findings(result, "pp-job") & {"comm_exposed", "straggler"}
    assert job_verdicts(result) == {"pp-job": "scheduling"}


def test_a_pipeline_waiting_longer_than_its_neighbour_computes_waits_for_the_wire() -> None:
    # each stage computes 0.03 s a step and waits 0.27 s for the other: no neighbour's
    # compute lasts that long, so most of it is activations and gradients in transit
    node = pipeline(0.0)
    for rank in node.ranks.values():
        rank.wait, rank.work, rank.comm = 0.0, 0.03, 0.27
    result = node.run()
    assert job_verdicts(result) == {"pp-job": "communication"}
    assert "comm_exposed" in findings(result, "pp-job")
    assert "straggler" not in findings(result, "pp-job")


def test_a_pipeline_with_small_bubbles_is_compute() -> None:
    result = pipeline(0.2).run()
    assert job_verdicts(result) == {"pp-job": "compute"}
    assert "pipeline_bubble" not in findings(result, "pp-job")


class StalledNode(Node):
    """Ranks that stopped: their stall lines and their last launch per group."""

    def stall(self, job: str, rank: str, where: str, collective: str = "", seq: str = "",
              group: str = "", frame: str = "") -> None:
        self.ranks[(job, rank)].stepping = False
        self.source.set("trainmon_training_stall_info", 1, job=job, rank=rank, where=where,
                        phase="", collective=collective, seq=seq, frame=frame, group=group)

    def launched(self, job: str, rank: str, group: str, root: str, seq: int) -> None:
        self.source.set("trainmon_training_group_collective_seq", seq, job=job, rank=rank,
                        group=group, root=root)


def test_the_rank_missing_from_the_collectives_the_others_wait_in_holds_the_job() -> None:
    # dp=2 x tp=2: rank 3 waits in a barrier its peer never joins; ranks 1 and 2 wait
    # for it in their dp and tp collectives, #41, which rank 3 has not reached (#40)
    node = StalledNode()
    healthy_job(node, "tp-job")
    node.tick()
    for rank, group, root in (("0", "tp", "0"), ("1", "dp", "1"), ("2", "tp", "2")):
        node.stall("tp-job", rank, "collective", "all_reduce", "41", group)
        node.launched("tp-job", rank, group, root, 41)
    node.stall("tp-job", "3", "collective", "barrier", "1", "group", "job.py:9 step")
    node.launched("tp-job", "3", "tp", "2", 40)
    node.launched("tp-job", "3", "dp", "1", 40)
    node.launched("tp-job", "3", "group", "0", 1)
    node.launched("tp-job", "1", "tp", "0", 41)
    result = node.run()
    assert hung_rank(result, "tp-job") == "3"


def test_a_rank_lost_without_a_word_is_named_once_its_peers_ended() -> None:
    # gloo: rank 1 killed; rank 0's next collective fails at once and its run ends
    node = Node()
    healthy_job(node, "kill-job", ranks=2)
    node.run(ticks=2)
    node.source.set("trainmon_training_last_report_timestamp_seconds", node.wall() - 1,
                    job="kill-job", rank="1")
    node.ranks[("kill-job", "1")].stepping = False
    node.source.set("trainmon_training_rank_end_timestamp_seconds", node.wall(),
                    job="kill-job", rank="0")
    result = node.run(ticks=2)
    assert hung_rank(result, "kill-job") == "1"


def test_ranks_that_all_ended_leave_no_lost_rank() -> None:
    node = Node()
    healthy_job(node, "done-job", ranks=2)
    node.run(ticks=2)
    for rank in ("0", "1"):
        node.source.set("trainmon_training_rank_end_timestamp_seconds", node.wall(),
                        job="done-job", rank=rank)
    result = node.run(ticks=2)
    assert hung_rank(result, "done-job") is None


def test_one_long_step_of_one_rank_is_no_straggler() -> None:
    # rank 0 reports a 10 s step (an evaluation the others report a moment later): over
    # the window it did 1.4x the median work, but in one half of the window only
    node = Node()
    healthy_job(node)
    collector = diagnosing(DiagnosisConfig(), node.source, clock=node.clock,
                           wall_clock=node.wall)
    evaluated(collector)
    for tick in range(6):
        node.tick()
        if tick == 4:
            node.source.add("trainmon_training_step_seconds_count", 1, job="llm", rank="0")
            node.source.add("trainmon_training_step_seconds_sum", 10.0, job="llm", rank="0")
        result = evaluated(collector)
    assert result.value("trainmon_diagnosis_straggler_ratio", job="llm") > 1.25
    assert "straggler" not in findings(result, "llm")
