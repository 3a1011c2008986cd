"""The diagnosis in words: the message catalogue, in English and Chinese.

One catalogue, keyed by the stable codes of the engine — ``rules`` and
``risks`` (finding codes), ``trainmon.diagnosis.nccl`` (problem names) — so
``doctor``'s report, its JSON and the docs use the same words, and the engine
itself has none. The risk findings' Chinese follows
the tuning article the project grew from (README.md, "The tuning article":
Tencent Cloud GPU instances vs self-hosted GPU clusters; 竞价实例即将被回收,
checkpoint 一定不要只写在本地临时盘, 预热, numactl 绑核). Each entry is an
``(English, 中文)`` pair of ``str.format`` templates over the finding's values
(advice too: ``numactl --cpunodebind={node:.0f}``); each ``*_bytes_per_second``
value also comes as ``*_bytes_per_second_text`` (``180.0 MB/s``), and each
number as ``*_plural`` (``""`` for 1, else ``"s"``: ``{steps:.0f}
step{steps_plural}``). Label values that reach the text (severities, storage
kinds, providers) are words of the catalogue too; English keeps the label
value itself, so it can be grepped in the metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

log = logging.getLogger(__name__)

LANGUAGES = ("en", "zh")
Pair = tuple[str, str]

KIND_NAMES: Mapping[str, Pair] = {
    "compute": ("compute", "算（计算）"),
    "communication": ("communication", "通（通信）"),
    "storage": ("storage", "存（数据加载与存储）"),
    "scheduling": ("scheduling", "调（调度）"),
    "none": ("none", "无结论"),
}

#: Severity tags of risk findings (``[CRITICAL]``, ``[严重]``).
SEVERITY_TAGS: Mapping[str, Pair] = {
    "critical": ("CRITICAL", "严重"),
    "warning": ("WARNING", "警告"),
}

#: Checkpoint storage kinds, the ``storage`` label of
#: ``trainmon_training_checkpoint_storage_info`` (``trainmon.node.mounts.STORAGE_KINDS``).
STORAGE_NAMES: Mapping[str, Pair] = {
    "network_fs": ("network_fs", "网络文件系统"),
    "object_store": ("object_store", "对象存储"),
    "cloud_disk": ("cloud_disk", "云硬盘"),
    "local_disk": ("local_disk", "本地盘"),
    "ephemeral": ("ephemeral", "临时存储"),
    "unknown": ("unknown", "未知存储"),
}

#: The ``provider`` label of ``trainmon_node_info``.
PROVIDER_NAMES: Mapping[str, Pair] = {
    "tencent": ("tencent", "腾讯云"),
    "self-hosted": ("self-hosted", "自建"),
}

HEADINGS: Mapping[str, Pair] = {
    "title_url": ("trainmon doctor: read {url} for {seconds:.0f} s",
                  "trainmon doctor：读取 {url}，共 {seconds:.0f} 秒"),
    "title_local": ("trainmon doctor: sampled this node for {seconds:.0f} s",
                    "trainmon doctor：在本机采样 {seconds:.0f} 秒"),
    "title_failed": ("trainmon doctor: {url}", "trainmon doctor：{url}"),
    "gpu": ("1. GPU", "1. GPU"),
    "storage": ("2. Storage", "2. 存储"),
    "network": ("3. Network", "3. 网络"),
    "verdict": ("4. Verdict", "4. 结论"),
    "platform": ("0. Platform", "0. 平台"),
    "no_platform": ("no platform metrics (the platform collector is off or not present)",
                    "未测到平台指标（platform 采集器未开启或不存在）"),
    "no_gpu": ("no GPU measured (NVML unavailable, or the gpu collector is off)",
               "未测到 GPU（NVML 不可用，或 gpu 采集器未开启）"),
    "no_jobs": ("no training job reported steps and no GPU process was seen",
                "没有训练任务上报步数，也没有发现使用 GPU 的进程"),
    "no_disks": ("no disk measured", "未测到磁盘"),
    "no_links": ("no network link measured", "未测到网络链路"),
    "next": ("next", "下一步"),
    "goodput": ("goodput {ratio} of its GPU time over 10 min; its largest loss since the "
                "daemon started: {loss} ({share})",
                "近 10 分钟有效训练占其 GPU 时间的 {ratio}；守护进程启动以来最大的损失："
                "{loss}（{share}）"),
    "goodput_only": ("goodput {ratio} of its GPU time over 10 min",
                     "近 10 分钟有效训练占其 GPU 时间的 {ratio}"),
    "healthy": ("No bottleneck that needs action.", "没有需要处理的瓶颈。"),
    "found": ("Bottleneck found.", "发现瓶颈。"),
    "risk": ("No bottleneck, but a risk that needs action (critical or warning above).",
             "没有瓶颈，但有需要处理的风险（见上面标为 [严重] 或 [警告] 的条目）。"),
    "goodput_run": ("goodput {ratio} of its GPU time in run {run}; its largest loss there: "
                    "{loss} ({share})",
                    "运行 {run} 中有效训练占其 GPU 时间的 {ratio}；"
                    "该运行最大的损失：{loss}（{share}）"),
    "goodput_run_only": ("goodput {ratio} of its GPU time in run {run}",
                         "运行 {run} 中有效训练占其 GPU 时间的 {ratio}"),
    "history": ("Run history (this node's ledger)", "运行历史（本节点的运行台账）"),
    "recent": ("The last run of each job that ended within {hours:.0f} h (this node's ledger)",
               "{hours:.0f} 小时内结束的各任务的最近一次运行（本节点的运行台账）"),
    "ended": ("No training job runs on this node now; its jobs' last runs are above.",
              "本节点现在没有训练任务在运行；各任务最近一次运行见上。"),
    "unmeasured": ("Could not measure: {reason}", "无法测量：{reason}"),
}

#: Why ``doctor`` could not measure, by ``Report.reason_code`` (the JSON's ``reason`` is the
#: English text).
REASONS: Mapping[str, Pair] = {
    "no_gpu_no_job": ("no GPU and no training job seen (is NVML present? do jobs report?)",
                      "没有发现 GPU，也没有发现训练任务（NVML 是否存在？任务是否在上报？）"),
    "too_few_steps": ("the jobs made too few steps in the window; sample longer",
                      "窗口内各任务完成的步数太少；请延长采样时间"),
    "cannot_read": ("cannot read {target}: {detail}", "无法读取 {target}：{detail}"),
    "not_prometheus": ("{target} is not Prometheus text: {detail}",
                       "{target} 返回的不是 Prometheus 文本：{detail}"),
    "untrusted": ("{detail}", "不读取该守护进程：{detail}"),
}

#: How a run ended (``trainmon.ledger.END_REASONS``; ``running``: still recorded as running).
END_WORDS: Mapping[str, Pair] = {
    "finished": ("finished", "正常结束"),
    "crashed": ("crashed", "崩溃"),
    "preempted": ("preempted", "被抢占"),
    "lost": ("lost", "失联"),
    "stalled": ("stalled", "停滞"),
    "running": ("still recorded as running", "仍记录为运行中"),
}

#: The run history of ``doctor`` (``report.history``): each job's run against its baseline.
HISTORY: Mapping[str, Pair] = {
    "run": ("{job}: run {run} at {rate} samples/s", "{job}：运行 {run}，{rate} samples/s"),
    "run_ended": ("{job}: run {run} {end} {ago} after {duration}: {rate} samples/s, "
                  "{verdict}, goodput {goodput}",
                  "{job}：运行 {run} 于 {ago}{end}，运行了 {duration}：{rate} samples/s，"
                  "{verdict}，有效训练 {goodput}"),
    "run_running": ("{job}: run {run} {end}, last updated {ago}: {rate} samples/s, "
                    "{verdict}, goodput {goodput}",
                    "{job}：运行 {run} {end}，最近一次更新在 {ago}：{rate} samples/s，"
                    "{verdict}，有效训练 {goodput}"),
    "verdict": ("verdict {kind}", "结论 {kind}"),
    "no_verdict": ("no verdict", "没有结论"),
    "compared": ("{change} compared with run {baseline} ({end} {ago}, same world size "
                 "{world_size} on {nodes} node{nodes_plural})",
                 "与运行 {baseline} 相比 {change}（{ago}{end}，同样的 world size {world_size}，"
                 "{nodes} 个节点）"),
    "fallback": ("; no comparable run finished, so its rate over the whole run",
                 "；没有可比的运行正常结束，所以用它整个运行的速率"),
    "slower": ("slower by more than {threshold}", "慢了超过 {threshold}"),
    "no_baseline": ("no earlier comparable run (same config, world size {world_size} on "
                    "{nodes} node{nodes_plural}, ended, with a rate)",
                    "没有更早的可比运行（同样的配置、world size {world_size}、{nodes} 个节点，"
                    "已结束且有速率）"),
    "fastest": ("{change} compared with the fastest comparable run of the last {days:.0f} "
                "days, {fastest} ({end} {ago})",
                "与最近 {days:.0f} 天内最快的可比运行 {fastest}（{ago}{end}）相比 {change}"),
    "commands": ("see: {commands}", "查看：{commands}"),
    "checkpoint_saves": ("{count:.0f} checkpoint save{count_plural} by its ranks in run {run}",
                         "运行 {run} 中其各 rank 共保存 {count:.0f} 次 checkpoint"),
    "checkpoints_all_runs": ("{count:.0f} checkpoint{count_plural} over all its runs",
                             "其所有运行共 {count:.0f} 次 checkpoint"),
    "unknown": ("?", "未知"),
}

#: The step a compute verdict adds (``report.history.profile_step``): the top operators of
#: the latest profile of the job's latest run (``trainmon profile``), by GPU self time
#: (``device``) or, on a CPU-only job, by CPU self time (``cpu``); without a profile
#: (``none``), the command that takes one.
PROFILE_STEP: Mapping[str, Pair] = {
    "device": ("Top operators by GPU time: {operators} (profile of rank {rank}, {steps:.0f} "
               "step{steps_plural}, {ago}{trace_text}).",
               "GPU 耗时最多的算子：{operators}（rank {rank} 的 profile，{steps:.0f} 步，{ago}"
               "{trace_text}）。"),
    "cpu": ("Top operators by CPU time: {operators} (profile of rank {rank}, {steps:.0f} "
            "step{steps_plural}, {ago}{trace_text}).",
            "CPU 耗时最多的算子：{operators}（rank {rank} 的 profile，{steps:.0f} 步，{ago}"
            "{trace_text}）。"),
    "trace": ("; trace: {trace}", "；trace：{trace}"),
    "none": ("To see which operators take the time, profile a few steps of one rank: "
             "`trainmon profile {job}`.",
             "要查看哪些算子耗时最多，可对一个 rank 分析几步：`trainmon profile {job}`。"),
}

#: ``12 min ago`` (``ago_text``): the unit by the size of the age.
AGO: Mapping[str, Pair] = {
    "seconds": ("{value:.0f} s ago", "{value:.0f} 秒前"),
    "minutes": ("{value:.0f} min ago", "{value:.0f} 分钟前"),
    "hours": ("{value:.0f} h ago", "{value:.0f} 小时前"),
    "days": ("{value:.0f} d ago", "{value:.0f} 天前"),
}

#: Words of the measurement lines.
WORDS: Mapping[str, Pair] = {
    "job": ("job", "任务"),
    "busy": ("busy", "繁忙"),
    "sawtooth": ("sawtooth", "锯齿"),
    "used": ("GiB used", "GiB 已用"),
    "data_wait": ("data wait", "数据等待"),
    "communication": ("communication", "通信"),
    "disk": ("disk", "磁盘"),
    "read": ("read", "读"),
    "write": ("write", "写"),
    "receive": ("receive", "接收"),
    "transmit": ("transmit", "发送"),
    "of": ("of", "/"),
    "port": ("port", "端口"),
    "comm_measured": ("measured exposed communication", "实测暴露通信"),
    "comm_phase": ("comm phase, not measured inside the job", "comm 阶段，任务内未实测"),
    "comm_mixed": ("measured exposed communication where measured, else the comm phase",
                   "有实测的 rank 用实测暴露通信，其余用 comm 阶段"),
    "overlapped": ("overlapped with compute", "与计算重叠"),
    "in_flight": ("while communicating", "通信时带宽"),
    "sm_active": ("SM active", "SM 活跃"),
    "sm_occupancy": ("occupancy", "占用率"),
    "tensor_active": ("tensor", "Tensor Core"),
    "dram_active": ("DRAM", "显存带宽"),
    "memory_of": ("of", "/"),
    "provider": ("provider", "平台"),
    "instance": ("instance", "实例"),
    "region": ("region", "地域"),
    "zone": ("zone", "可用区"),
    "spot": ("spot instance", "竞价实例"),
    "yes": ("yes", "是"),
    "no": ("no", "否"),
    "unknown": ("unknown", "未知"),
    "metadata": ("metadata service", "元数据服务"),
    "up": ("up", "正常"),
    "down": ("down", "不可用"),
    "reclaim_at": ("reclaim scheduled at {at} (in {seconds:.0f} s)",
                   "计划回收时间 {at}（还剩 {seconds:.0f} 秒）"),
    "no_reclaim": ("no reclaim scheduled", "没有计划中的回收"),
    "checkpoint_age": ("last checkpoint {age:.0f} s ago", "最近 checkpoint 在 {age:.0f} 秒前"),
    "took": ("took {seconds:.1f} s", "耗时 {seconds:.1f} 秒"),
    "no_checkpoint": ("no checkpoint reported", "未上报 checkpoint"),
    "nfs_reads": ("{milliseconds:.1f} ms per READ", "每次 READ {milliseconds:.1f} 毫秒"),
    "numa_node": ("NUMA node", "NUMA 节点"),
    "numa_local": ("of its CPUs on the GPU's node", "的 CPU 在 GPU 所在节点"),
    "numa_far": ("far", "跨 NUMA 节点"),
    "numa_unknown": ("NUMA topology unknown (virtualised host: numa_node = -1); binding is "
                     "unlikely to pay off here",
                     "NUMA 拓扑未知（虚拟化主机：numa_node = -1）；在这里绑核收益很小"),
    "numa_no_ratio": ("no process CPU binding measured", "未测到进程的 CPU 绑定"),
    "rdma_active": ("ACTIVE", "ACTIVE"),
    "rdma_down": ("not active", "未激活"),
    "no_gpm": ("no SM/tensor/DRAM activity (GPM needs Hopper or newer): a compute verdict "
               "rests on utilization alone",
               "未测到 SM/Tensor Core/显存带宽活跃度（GPM 需要 Hopper 及更新的 GPU）："
               "计算类结论仅依据利用率"),
}

#: Where a hung rank is (``hung_rank``'s ``where``), in words.
HUNG_WHERE: Mapping[str, Pair] = {
    "data_loader": ("in its data loader's next()", "卡在数据加载器的 next() 里"),
    "checkpoint": ("in a checkpoint save", "卡在 checkpoint 保存中"),
    "phase": ("in phase {phase}", "卡在阶段 {phase} 中"),
    "code": ("in its own code", "卡在自己的代码里"),
    "collective": ("in a collective", "卡在集合通信中"),
    "missing": ("missing from the collective the others wait in, and silent",
                "不在其他 rank 等待的集合通信里，也没有上报"),
}

FINDINGS: Mapping[str, Pair] = {
    "hung_rank": (
        "rank {rank} holds the job: it is {where_words}{frame_text}{waiting_text}",
        "rank {rank} 拖住了整个任务：它{where_words}{frame_text}{waiting_text}"),
    "hung_rank_gone": (
        "rank {rank} is gone: its reporter went silent{waiting_text}",
        "rank {rank} 已经不在了：它的上报停止了{waiting_text}"),
    "hung_rank_elsewhere": (
        "no step for {seconds:.0f} s: every stalled rank on this node waits in a "
        "collective{waiting_text}; the rank that holds them is on another node",
        "已 {seconds:.0f} 秒没有完成一步：本节点卡住的 rank 都在等集合通信{waiting_text}；"
        "拖住它们的 rank 在其他节点上"),
    "stalled": (
        "rank(s) {ranks} made no step for {seconds:.0f} s (threshold {threshold:.0f} s)",
        "rank {ranks} 已 {seconds:.0f} 秒没有完成一步（阈值 {threshold:.0f} 秒）"),
    "insufficient_data": (
        "only {steps:.0f} step{steps_plural} in the window (needs {threshold:.0f})",
        "窗口内只有 {steps:.0f} 步（至少需要 {threshold:.0f} 步）"),
    "data_wait": (
        "rank {rank} waits for data {ratio:.0%} of each step (threshold {threshold:.0%})",
        "rank {rank} 每步有 {ratio:.0%} 的时间在等数据（阈值 {threshold:.0%}）"),
    "sawtooth_data_wait": (
        "GPU utilization saw-tooths ({sawtooth:.2f}) while the data wait rises ({ratio:.0%})",
        "GPU 利用率呈锯齿状（{sawtooth:.2f}），同时数据等待在上升（{ratio:.0%}）"),
    "straggler": (
        "rank {rank} needs {factor:.2f}x the work time per step of the job's median rank "
        "(threshold {threshold:.2f}x)",
        "rank {rank} 每步的计算时间是各 rank 中位数的 {factor:.2f} 倍（阈值 {threshold:.2f} 倍）"),
    "comm_exposed": (
        "the ranks wait for communication after their compute {ratio:.0%} of each step "
        "(measured exposed communication; threshold {threshold:.0%})",
        "各 rank 每步有 {ratio:.0%} 的时间在算完后等待通信"
        "（实测的暴露通信；阈值 {threshold:.0%}）"),
    "pipeline_bubble": (
        "the pipeline stages wait for each other {ratio:.0%} of each step (bubbles: exposed "
        "waits of the pp group on the stage that waits least; threshold {threshold:.0%})",
        "流水线各 stage 每步有 {ratio:.0%} 的时间在互相等待（气泡：等待最少的 stage 在 pp "
        "组上的暴露等待；阈值 {threshold:.0%}）"),
    "comm_phase": (
        "communication takes {ratio:.0%} of each step (the comm phase: not measured inside "
        "the job, so time overlapped with compute may count; threshold {threshold:.0%})",
        "通信占每步时间的 {ratio:.0%}（依据 comm 阶段：任务内未实测，与计算重叠的时间也可能计入；"
        "阈值 {threshold:.0%}）"),
    "link_saturated": (
        "{link} runs at {ratio:.0%} of its link rate (threshold {threshold:.0%})",
        "{link} 的流量达到链路速率的 {ratio:.0%}（阈值 {threshold:.0%}）"),
    "idle_gpus": (
        "GPU(s) {gpus} of the job are idle while it steps",
        "任务占用的 GPU {gpus} 在训练时处于空闲"),
    "host_bound": (
        "GPUs only {utilization:.0%} busy although the job hardly waits for data ({ratio:.0%}) "
        "or communication ({comm:.0%})",
        "GPU 只有 {utilization:.0%} 在忙，而任务几乎不等数据（{ratio:.0%}）"
        "也不等通信（{comm:.0%}）"),
    "gpu_bound": (
        "GPUs busy ({utilization:.0%}); data wait {ratio:.0%}, communication {comm:.0%}; "
        "no SM or tensor activity (GPM) measured, so this rests on utilization alone",
        "GPU 繁忙（{utilization:.0%}）；数据等待 {ratio:.0%}，通信 {comm:.0%}；"
        "未测到 SM 与 Tensor Core 活跃度（GPM），此结论仅依据利用率"),
    "gpu_bound_unmeasured": (
        "the job hardly waits for data ({ratio:.0%}) or communication ({comm:.0%}); "
        "GPU utilization was not measured",
        "任务几乎不等数据（{ratio:.0%}）也不等通信（{comm:.0%}）；未测到 GPU 利用率"),
    "gpu_efficient": (
        "GPUs {gpus} compute efficiently: {utilization:.0%} busy, SM active {sm_active:.0%}, "
        "tensor pipes {tensor_active:.0%}, DRAM {dram_active:.0%}",
        "GPU {gpus} 计算高效：繁忙 {utilization:.0%}，SM 活跃 {sm_active:.0%}，"
        "Tensor Core {tensor_active:.0%}，显存带宽 {dram_active:.0%}"),
    "launch_bound": (
        "GPUs {gpus} look {utilization:.0%} busy but their SMs are active only "
        "{sm_active:.0%} (threshold {threshold:.0%}): small kernels, launch-bound or host "
        "overhead",
        "GPU {gpus} 利用率显示 {utilization:.0%}，但 SM 只有 {sm_active:.0%} 在活跃"
        "（阈值 {threshold:.0%}）：kernel 太小、受限于 kernel 启动或主机侧开销"),
    "memory_bound": (
        "GPUs {gpus} are memory-bound: DRAM active {dram_active:.0%} (threshold "
        "{threshold:.0%}), SM active {sm_active:.0%}, tensor pipes {tensor_active:.0%}",
        "GPU {gpus} 受限于显存带宽：显存带宽活跃 {dram_active:.0%}（阈值 {threshold:.0%}），"
        "SM 活跃 {sm_active:.0%}，Tensor Core {tensor_active:.0%}"),
    "tensor_idle": (
        "the tensor pipes of GPUs {gpus} are active only {tensor_active:.0%} "
        "(threshold {threshold:.0%}) while they are {utilization:.0%} busy: mixed precision "
        "(bf16/AMP) is not in use",
        "GPU {gpus} 繁忙 {utilization:.0%}，但 Tensor Core 只有 {tensor_active:.0%} 在活跃"
        "（阈值 {threshold:.0%}）：没有使用混合精度（bf16/AMP）"),
    "oom_risk": (
        "GPU(s) {gpus} of the job use {ratio:.0%} of their memory (less than "
        "{threshold:.0%} free): out-of-memory risk",
        "任务的 GPU {gpus} 显存已用 {ratio:.0%}（剩余不足 {threshold:.0%}）："
        "有显存不足（OOM）风险"),
    "idle_held": (
        "GPU(s) {gpus} are held by pid(s) {pids}, which do no work on them",
        "GPU {gpus} 被进程 {pids} 占用，但没有在上面做任何计算"),
    "idle_held_allocated": (
        "GPU(s) {gpus} are allocated to the pod by the kubelet, and no process runs on them",
        "GPU {gpus} 已由 kubelet 分配给该 pod，但上面没有任何进程在运行"),
    "no_telemetry": (
        "pid(s) {pids} use GPUs but report no training steps",
        "进程 {pids} 在使用 GPU，但没有上报训练步数"),
    "spot_reclaim": (
        "spot instance will be reclaimed at {at} (in {seconds:.0f} s) — checkpoint now; "
        "jobs on this node: {jobs}",
        "竞价实例即将被回收：{at}（还剩 {seconds:.0f} 秒）——立即保存 checkpoint；"
        "本节点上的任务：{jobs}"),
    "checkpoint_overdue": (
        "last checkpoint {age:.0f} s ago ({at}) on a spot instance (threshold "
        "{threshold:.0f} s): a reclaim loses all training since then",
        "运行在竞价实例上，最近一次 checkpoint 在 {age:.0f} 秒前（{at}，阈值 {threshold:.0f} 秒）："
        "实例一旦被回收，之后的训练全部白做"),
    "checkpoint_missing": (
        "no checkpoint reported in {run:.0f} s of training on a spot instance (threshold "
        "{threshold:.0f} s; jobs report them with reporter.checkpoint(path))",
        "运行在竞价实例上，已训练 {run:.0f} 秒却没有上报任何 checkpoint（阈值 {threshold:.0f} 秒；"
        "用 reporter.checkpoint(path) 上报）"),
    "checkpoint_local_disk": (
        "checkpoints are written to {mountpoint} ({fstype}, {storage}): storage that is lost "
        "with the cloud instance",
        "checkpoint 写在 {mountpoint}（{fstype}，{storage}）：云实例释放或回收后这份存储就没了，"
        "checkpoint 一定不要只写在本地临时盘"),
    "mixed_gpus": (
        "the job's GPUs {gpus} span GPU models or clock classes ({models}; SM clocks "
        "{slowest_mhz:.0f}-{fastest_mhz:.0f} MHz): the slowest sets the pace of every step",
        "任务的 GPU {gpus} 混用了不同型号或频率档位（{models}；SM 频率 "
        "{slowest_mhz:.0f}-{fastest_mhz:.0f} MHz）：最慢的那块决定每一步的速度"),
    "fail_slow": (
        "{who} became {ratio:.0%} slower at {start_text} and stayed slower: its "
        "{part_words} grew{growth_text}; {cause_words}",
        "{who}从 {start_text} 起慢了 {ratio:.0%}，一直没有恢复：{part_words}变长了"
        "{growth_text}；{cause_words}"),
    "numa_far": (
        "process(es) {processes} run mostly on CPUs outside their GPU's NUMA node (share of "
        "allowed CPUs on the GPU's node; threshold {threshold:.0%})",
        "进程 {processes} 的 CPU 大多不在其 GPU 所在的 NUMA 节点上"
        "（括号内为允许使用的 CPU 中位于 GPU 所在节点的比例；阈值 {threshold:.0%}）"),
    "nccl_over_sockets": (
        "NCCL seems to run over TCP sockets although RDMA is present: communication takes "
        "{ratio:.0%} of each step (threshold {threshold:.0%}) of a job on {world_size:.0f} "
        "ranks, yet the ACTIVE RDMA ports {rdma} move only {rdma_bytes_per_second_text} while "
        "{nic} carries {nic_bytes_per_second_text}",
        "节点有 RDMA，NCCL 却像是在走 TCP Socket：这个 {world_size:.0f} 个 rank 的任务每步有 "
        "{ratio:.0%} 的时间在通信（阈值 {threshold:.0%}），但处于 ACTIVE 的 RDMA 端口 {rdma} "
        "只有 {rdma_bytes_per_second_text}，而网卡 {nic} 承载了 {nic_bytes_per_second_text}"),
}

ADVICE: Mapping[str, Pair] = {
    "stalled": (
        "Look at the stalled ranks: their logs and stacks (py-spy dump --pid), NCCL timeouts "
        "(TORCH_NCCL_ASYNC_ERROR_HANDLING=1, NCCL_DEBUG=WARN), a hung checkpoint write, or a "
        "dead peer node.",
        "检查卡住的 rank：日志与调用栈（py-spy dump --pid）、NCCL 超时"
        "（TORCH_NCCL_ASYNC_ERROR_HANDLING=1、"
        "NCCL_DEBUG=WARN）、卡住的 checkpoint 写入，或已经宕掉的对端节点。"),
    "insufficient_data": (
        "Let the job run longer, or check that it reports steps (trainmon.client.Reporter).",
        "让任务多跑一会儿，或确认它在上报步数（trainmon.client.Reporter）。"),
    "data_wait": (
        "Feed the GPUs faster: raise DataLoader num_workers, set pin_memory=True and "
        "persistent_workers=True, raise prefetch_factor; move the data to local NVMe or page "
        "cache; use sharded formats (WebDataset) or GPU decoding (DALI).",
        "加快数据供给：增大 DataLoader 的 num_workers，设置 pin_memory=True、"
        "persistent_workers=True，增大 prefetch_factor；把数据放到本地 NVMe 或页缓存；"
        "使用分片格式（WebDataset）或 GPU 解码（DALI）。"),
    "straggler": (
        "Look at the slow rank's node: GPU clocks and throttling "
        "(trainmon_gpu_throttle_seconds_total), other work on its GPU or CPUs, an uneven data "
        "shard or sequence lengths; drain the node if its hardware is at fault.",
        "检查慢 rank 所在节点：GPU 频率与降频（trainmon_gpu_throttle_seconds_total）、"
        "同一 GPU 或 CPU 上的其他负载、数据分片或序列长度不均；若是硬件问题，请将该节点下线。"),
    "pipeline_bubble": (
        "Fill the pipeline: more microbatches per step (the bubble is (stages - 1) / "
        "(microbatches + stages - 1)), an interleaved or zero-bubble schedule "
        "(ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble), stages of equal cost; "
        "or fewer stages, with the memory that frees spent on data parallelism.",
        "填满流水线：每步更多的 microbatch（气泡占比为 (stage 数 - 1) / (microbatch 数 + "
        "stage 数 - 1)）、交错或零气泡调度（ScheduleInterleaved1F1B、"
        "ScheduleInterleavedZeroBubble）、各 stage 计算量均衡；或减少 stage 数，把省下的显存用于"
        "数据并行。"),
    "comm_exposed_tp": (
        "Most of the wait is tensor-parallel communication, on the critical path by design: "
        "keep each tensor-parallel group inside one node (NVLink, not the network), lower "
        "the tensor-parallel degree in favour of FSDP or pipeline stages, or overlap it "
        "(sequence parallel, async tensor parallel with torch.compile).",
        "等待主要来自张量并行通信，它按设计就在关键路径上：让每个张量并行组留在同一节点内（走 "
        "NVLink 而非网络），降低张量并行度、改用 FSDP 或流水线 stage，或让它与计算重叠（序列并行、"
        "torch.compile 的异步张量并行）。"),
    "comm_exposed": (
        "The steps wait for the network. Check the channel first: run once with "
        "NCCL_DEBUG=INFO and look for NET/IB, not NET/Socket; NCCL_IB_DISABLE unset, "
        "NCCL_IB_HCA naming the active HCAs, NCCL_SOCKET_IFNAME the right NIC "
        "(NCCL_IB_GID_INDEX on RoCE). Then the link: ibstat/ibstatus port rate and state, "
        "ib_write_bw between two nodes, nccl-tests all_reduce_perf against the nominal "
        "bandwidth, the NIC and IB error alerts. Then overlap: DDP bucket_cap_mb, FSDP "
        "prefetch, gradient accumulation with no_sync, bf16 gradients. Then placement: the "
        "job's nodes in one availability zone and VPC (cloud) or under one leaf switch.",
        "各步在等网络。先查通道：用 NCCL_DEBUG=INFO 跑一次，日志应为 NET/IB 而不是 NET/Socket；"
        "不要设置 NCCL_IB_DISABLE，NCCL_IB_HCA 指向在用的 HCA，NCCL_SOCKET_IFNAME 指向正确的网卡"
        "（RoCE 还要 NCCL_IB_GID_INDEX）。再查链路：ibstat/ibstatus 的端口速率与状态、"
        "两节点间 ib_write_bw、用 nccl-tests 的 all_reduce_perf 对比标称带宽、网卡与 IB 错误告警。"
        "再查重叠：DDP bucket_cap_mb、FSDP 预取、梯度累积时用 no_sync、bf16 梯度。"
        "最后查放置：云上让任务的节点在同一可用区、同一 VPC，"
        "自建集群让它们在同一台 leaf 交换机下。"),
    "comm_phase": (
        "Measure it inside the job first (reporter.instrument(model)): the comm phase also "
        "counts communication overlapped with compute. Then check the channel (NCCL_DEBUG=INFO "
        "once shows NET/IB, not NET/Socket; NCCL_IB_DISABLE unset, NCCL_IB_HCA and "
        "NCCL_SOCKET_IFNAME right), the link (ibstat port rate, ib_write_bw, nccl-tests "
        "all_reduce_perf), overlap with backward (DDP bucket_cap_mb, no_sync with gradient "
        "accumulation), sending less (bf16 gradients, FSDP/ZeRO settings) and placement "
        "(one availability zone, one leaf switch).",
        "先在任务内实测通信（reporter.instrument(model)）：comm 阶段会把与计算重叠的通信也算进去。"
        "再查通道（临时用 NCCL_DEBUG=INFO 确认是 NET/IB 而不是 NET/Socket；不要设置 "
        "NCCL_IB_DISABLE，NCCL_IB_HCA 与 NCCL_SOCKET_IFNAME 要正确）、链路（ibstat 端口速率、"
        "ib_write_bw、nccl-tests 的 all_reduce_perf）、与反向计算的重叠（DDP bucket_cap_mb、"
        "梯度累积时用 no_sync）、减少通信量（bf16 梯度、FSDP/ZeRO 配置）和放置（同一可用区、"
        "同一台 leaf 交换机）。"),
    "link_saturated": (
        "The network runs near its link rate: use RDMA/GPUDirect where available, accumulate "
        "or compress gradients, and report a comm phase (reporter.phase('comm')) to confirm.",
        "网络接近链路速率：尽量使用 RDMA/GPUDirect，做梯度累积或压缩，并上报 comm 阶段"
        "（reporter.phase('comm')）以便确认。"),
    "idle_gpus": (
        "Release GPUs the job does not use (CUDA_VISIBLE_DEVICES, one process per GPU, "
        "torch.cuda.set_device before any CUDA call) or find out why their ranks do no work.",
        "释放任务没有用到的 GPU（CUDA_VISIBLE_DEVICES、每个 GPU 一个进程、在任何 CUDA 调用前执行 "
        "torch.cuda.set_device），或查明这些 rank 为何不干活。"),
    "host_bound": (
        "The host side is the limit: cut Python overhead per step (torch.compile, CUDA "
        "graphs), raise the batch size, move CPU preprocessing into DataLoader workers.",
        "瓶颈在主机侧：降低每步的 Python 开销（torch.compile、CUDA Graphs），增大 batch size，"
        "把 CPU 预处理移到 DataLoader 的 worker 中。"),
    "gpu_bound": (
        "The GPU itself is the limit, which is the healthy case. To go faster: mixed precision "
        "(bf16/AMP), fused kernels (torch.compile, FlashAttention), a larger batch per GPU; "
        "profile with torch.profiler.",
        "瓶颈在 GPU 本身，这是健康的状态。若要更快：混合精度（bf16/AMP）、融合算子（torch.compile、"
        "FlashAttention）、增大单卡 batch；用 torch.profiler 分析。"),
    "gpu_efficient": (
        "The GPUs spend their time in tensor-core math, the healthy case. To go faster: "
        "fused kernels (torch.compile, FlashAttention), FP8 on Hopper (Transformer Engine), "
        "a larger batch per GPU, or more GPUs; profile with torch.profiler or nsys.",
        "GPU 的时间主要花在 Tensor Core 的矩阵运算上，这是健康的状态。若要更快：融合算子"
        "（torch.compile、FlashAttention）、Hopper 上用 FP8（Transformer Engine）、增大单卡 batch "
        "或增加 GPU；用 torch.profiler 或 nsys 分析。"),
    "launch_bound": (
        "The GPU waits for work between small kernels: capture the step in CUDA graphs "
        "(torch.compile(mode='reduce-overhead') or torch.cuda.CUDAGraph), fuse kernels with "
        "torch.compile, raise the batch size per GPU, and cut Python work per step; nsys "
        "shows the gaps between kernels.",
        "GPU 在小 kernel 之间等待任务：用 CUDA Graphs 捕获整步"
        "（torch.compile(mode='reduce-overhead') 或 torch.cuda.CUDAGraph），"
        "用 torch.compile 融合算子，增大单卡 batch size，减少每步的 Python 开销；"
        "nsys 可以看到 kernel 之间的空隙。"),
    "memory_bound": (
        "Memory bandwidth is the limit: fuse element-wise operations (torch.compile, "
        "FlashAttention, fused optimizers with fused=True), keep activations in bf16 to halve "
        "the bytes, raise the batch size for more arithmetic per byte; ncu's memory workload "
        "analysis names the kernels.",
        "瓶颈在显存带宽：融合逐元素算子（torch.compile、FlashAttention、fused=True 的优化器），"
        "激活用 bf16 以减半访存量，增大 batch 提高计算访存比；用 ncu 的内存分析找出相关 kernel。"),
    "tensor_idle": (
        "Use the tensor cores: train in bf16 with torch.autocast(device_type='cuda', "
        "dtype=torch.bfloat16) (or AMP with a GradScaler for fp16), or at least allow TF32 "
        "(torch.set_float32_matmul_precision('high')); keep matrix dimensions multiples of 8.",
        "用上 Tensor Core：用 torch.autocast(device_type='cuda', dtype=torch.bfloat16) 以 bf16 训练"
        "（fp16 需配合 GradScaler 的 AMP），至少开启 TF32"
        "（torch.set_float32_matmul_precision('high')）；矩阵维度保持为 8 的倍数。"),
    "oom_risk": (
        "Make room in GPU memory before the job runs out: activation checkpointing, a smaller "
        "micro-batch with gradient accumulation, FSDP/ZeRO sharding of optimizer state, bf16; "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation "
        "(torch.cuda.memory_summary shows what the caching allocator holds).",
        "在显存耗尽前腾出空间：激活重计算（activation checkpointing）、"
        "减小 micro-batch 并配合梯度累积、用 FSDP/ZeRO 切分优化器状态、使用 bf16；"
        "设置 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True 减少碎片"
        "（torch.cuda.memory_summary 可查看缓存分配器占用）。"),
    "idle_held": (
        "Find the owner (pod or Slurm job above) and stop the process or reclaim the GPUs; a "
        "leftover notebook or a crashed job's orphan often holds GPU memory.",
        "找到进程的所有者（上面的 pod 或 Slurm 作业），结束该进程或回收 GPU；"
        "常见原因是遗留的 notebook 或崩溃任务的残留进程占着显存。"),
    "no_telemetry": (
        "Report steps from the training loop with trainmon.client.Reporter so trainmon can "
        "tell what holds the job back.",
        "在训练循环中用 trainmon.client.Reporter 上报步数，trainmon 才能判断任务被什么拖慢。"),
}
ADVICE = {**ADVICE, **{
    "hung_rank_data_loader": (
        "Look at rank {rank}'s input: a dead NFS/CFS mount (ls on the data path hangs), a "
        "DataLoader worker stuck in __getitem__ (py-spy dump --pid on the workers), a full "
        "/dev/shm; a timeout on the reads, or data on local NVMe.",
        "检查 rank {rank} 的数据输入：NFS/CFS 挂载已失效（在数据路径上 ls 会卡住）、DataLoader "
        "worker 卡在 __getitem__（对 worker 执行 py-spy dump --pid）、/dev/shm 已满；为读取设置"
        "超时，或把数据放到本地 NVMe。"),
    "hung_rank_checkpoint": (
        "Rank {rank}'s checkpoint write does not return: check the storage it writes to (its "
        "latency, space, an object-store client waiting on the network); save "
        "asynchronously, to a cloud disk or CFS.",
        "rank {rank} 的 checkpoint 写入一直没有返回：检查它写入的存储（延迟、空间、等待网络的"
        "对象存储客户端）；改为异步保存，写到云硬盘或 CFS。"),
    "hung_rank_phase": (
        "Rank {rank} is stuck in its phase {phase}{frame_text}: dump its threads "
        "(py-spy dump --pid) and look for a lock never released or a blocking call.",
        "rank {rank} 卡在阶段 {phase}{frame_text}：导出它的线程栈（py-spy dump --pid），"
        "找出未释放的锁或阻塞调用。"),
    "hung_rank_code": (
        "Rank {rank} is stuck in user code{frame_text}: dump its threads (py-spy dump --pid) "
        "and look for a lock never released, a busy loop or a blocking call between "
        "backward and the optimizer step.",
        "rank {rank} 卡在用户代码中{frame_text}：导出它的线程栈（py-spy dump --pid），"
        "找出未释放的锁、死循环，或 backward 与优化器 step 之间的阻塞调用。"),
    "hung_rank_collective": (
        "Rank {rank} waits in a collective its peers never join{frame_text}: a collective "
        "issued on one rank only (a condition that differs between ranks, an uneven number "
        "of batches, an exception caught on one rank); compare the ranks' code paths, and "
        "set TORCH_DISTRIBUTED_DEBUG=DETAIL to have the mismatch reported.",
        "rank {rank} 在等一个其他 rank 永远不会加入的集合通信{frame_text}：只在一个 rank 上发起的"
        "集合通信（各 rank 条件不同、批次数不一致、某个 rank 上被吞掉的异常）；对比各 rank 的代码"
        "路径，并设置 TORCH_DISTRIBUTED_DEBUG=DETAIL 让 PyTorch 报告不匹配。"),
    "hung_rank_missing": (
        "Rank {rank} has not reached the collective the others wait in and reports nothing: "
        "a stopped (SIGSTOP, a debugger) or frozen process, or a node that lost its network: "
        "look at it with py-spy dump --pid, its state in ps (T: stopped, D: in the kernel).",
        "rank {rank} 没有进入其他 rank 正在等待的集合通信，也没有上报：进程被暂停（SIGSTOP、"
        "调试器）或冻结，或节点断网：用 py-spy dump --pid 查看它，并看 ps 中的状态（T：已暂停，"
        "D：卡在内核）。"),
    "hung_rank_gone": (
        "Rank {rank}'s process ended without a word (killed, out of memory: dmesg, the "
        "scheduler's log) and the others wait for it: restart the job from its checkpoint; "
        "TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (NCCL) ends such waits with an error.",
        "rank {rank} 的进程没有任何告别就结束了（被杀、内存不足：看 dmesg 与调度器日志），其他 "
        "rank 在等它：从 checkpoint 重启任务；TORCH_NCCL_ASYNC_ERROR_HANDLING=1（NCCL）会让这类"
        "等待以报错结束。"),
    "hung_rank_elsewhere": (
        "Run trainmon doctor on the job's other nodes: the rank that is not in the "
        "collective names itself there; in Prometheus, the lagging rank's collective "
        "sequence number tells it.",
        "在该任务的其他节点上运行 trainmon doctor：不在集合通信里的那个 rank 会在那里被指出；"
        "在 Prometheus 中，集合通信序号落后的 rank 就是它。"),
    "spot_reclaim": (
        "Save a checkpoint now, to a cloud disk (CBS), CFS or COS rather than the instance's "
        "local disk, and resume on a new instance from the same image "
        "(--resume_from_checkpoint): save → release the old instance → start a new one → "
        "resume, task-level elasticity instead of auto scaling.",
        "立即保存 checkpoint，写到云硬盘（CBS）、CFS 或 COS，不要只写实例本地盘；"
        "再用同一份镜像新开实例，从最近的 checkpoint 恢复训练（--resume_from_checkpoint）："
        "保存 checkpoint → 关闭旧实例 → 开启新实例 → 恢复训练，用任务级弹性代替自动伸缩。"),
    "checkpoint_overdue": (
        "Checkpoint more often on spot instances (within {threshold:.0f} s), to a cloud disk "
        "(CBS), CFS or COS, and make the script resume from the latest one "
        "(--resume_from_checkpoint).",
        "竞价实例上要更频繁地保存 checkpoint（间隔不超过 {threshold:.0f} 秒），写到云硬盘（CBS）、"
        "CFS 或 COS，并让训练脚本支持从最近的 checkpoint 断点续训（--resume_from_checkpoint）。"),
    "checkpoint_missing": (
        "A spot instance may be reclaimed at any time: save checkpoints (within {threshold:.0f} "
        "s) to a cloud disk (CBS), CFS or COS and report them with "
        "`with reporter.checkpoint(path): torch.save(...)`, so trainmon can tell their age.",
        "竞价实例随时可能被回收：定期保存 checkpoint（间隔不超过 {threshold:.0f} 秒），"
        "写到云硬盘（CBS）、CFS 或 COS，并用 `with reporter.checkpoint(path): torch.save(...)` "
        "上报，trainmon 才能知道它有多旧。"),
    "checkpoint_local_disk": (
        "Never keep checkpoints only on the instance's local or temporary disk: write them to "
        "a cloud disk (CBS), CFS or COS (or copy each one there), so a failed or reclaimed "
        "instance can be replaced from the same image and resume.",
        "checkpoint 一定不要只写在本地临时盘，要写到云硬盘（CBS）、CFS 或 COS 上"
        "（或每次保存后拷过去），"
        "这样实例故障或被回收后，用同一份镜像重开实例就能继续训练。"),
    "numa_far": (
        "Bind each rank to its GPU's NUMA node: numactl --cpunodebind={node:.0f} "
        "--membind={node:.0f} python train.py for GPU {gpu} (lscpu and nvidia-smi topo -m "
        "show which node each GPU and NIC sits on; torchrun ranks can bind themselves with "
        "os.sched_setaffinity). On virtualised hosts check that it helps before keeping it.",
        "把每个 rank 绑到其 GPU 所在的 NUMA 节点：GPU {gpu} 用 numactl --cpunodebind={node:.0f} "
        "--membind={node:.0f} python train.py（lscpu 和 nvidia-smi topo -m 可以看到每块 GPU 与网卡"
        "所在的节点；torchrun 启动的 rank 也可以用 os.sched_setaffinity 自行绑核）。"
        "虚拟化环境里先确认绑定确实有收益再保留。"),
    "nccl_over_sockets": (
        "Make NCCL use the RDMA ports: run once with NCCL_DEBUG=INFO and look for NET/IB, not "
        "NET/Socket, in the log; set NCCL_IB_DISABLE=0, NCCL_IB_HCA={hcas}, "
        "NCCL_SOCKET_IFNAME={nic} (bootstrap only), NCCL_IB_GID_INDEX on RoCE, and "
        "NCCL_NET_GDR_LEVEL for GPUDirect RDMA; give the pod its RDMA device (and IPC_LOCK). "
        "Then nccl-tests all_reduce_perf should reach the fabric's bandwidth.",
        "让 NCCL 走 RDMA：用 NCCL_DEBUG=INFO 跑一次，日志里应出现 NET/IB 而不是 NET/Socket；"
        "设置 NCCL_IB_DISABLE=0、NCCL_IB_HCA={hcas}、NCCL_SOCKET_IFNAME={nic}（仅用于 bootstrap），"
        "RoCE 还要 NCCL_IB_GID_INDEX，GPUDirect RDMA 看 NCCL_NET_GDR_LEVEL；"
        "为 pod 分配 RDMA 设备（及 IPC_LOCK）。"
        "之后用 nccl-tests 的 all_reduce_perf 确认带宽达到标称值。"),
    "nfs_prefetch": (
        "The data is read from {source} ({fstype}) during training: warm the dataset onto "
        "local NVMe (or a high-performance cloud disk) before training starts and read it "
        "from there — don't let the training loop fetch remote files every step; pack small "
        "files into large shards (TFRecord, WebDataset).",
        "训练时在从 {source}（{fstype}）读数据：训练开始前先做一轮预热，把数据集拷到本地 NVMe"
        "（或高性能云硬盘）上再读，不要让训练循环每次都远程读文件；小文件打包成大文件"
        "（TFRecord、WebDataset）。"),
}}
#: What a fail-slow change grew in (``failslow.PARTS``) and what the node's evidence
#: names as its cause (``failslow.CAUSES`` and the defaults), in words.
FAIL_SLOW_PARTS: Mapping[str, Pair] = {
    "compute": ("compute per step", "每步计算时间"),
    "data_wait": ("data wait per step", "每步数据等待"),
    "comm": ("exposed communication per step", "每步暴露通信"),
    "step": ("step time", "步时长"),
}
FAIL_SLOW_CAUSES: Mapping[str, Pair] = {
    "cpu_throttled": ("its cgroup's CPU quota throttles it", "它所在 cgroup 的 CPU 配额在限流"),
    "gpu_thermal": ("its GPU's clocks are held down for heat", "GPU 因过热降频"),
    "gpu_power_cap": ("its GPU is held at its power cap", "GPU 触及功耗上限而降频"),
    "gpu_clocks": ("its GPU's SM clocks dropped", "GPU 的 SM 频率下降了"),
    "pcie_link": ("its GPU's PCIe link runs below its width or generation",
                  "GPU 的 PCIe 链路宽度或代数降级了"),
    "pcie_replays": ("its GPU's PCIe link replays packets", "GPU 的 PCIe 链路在重传"),
    "network_errors": ("the node's NIC or InfiniBand ports count errors",
                       "节点的网卡或 InfiniBand 端口在报错"),
    "cpu_pressure": ("the node's CPUs are oversubscribed (PSI)", "节点 CPU 资源紧张（PSI）"),
    "cpu_steal": ("the hypervisor steals CPU time", "宿主机在抢占 CPU 时间（steal）"),
    "mount_latency": ("the dataset's network mount answers slower",
                      "数据集所在的网络文件系统响应变慢了"),
    "data_loading": ("its data loading got slower", "数据加载变慢了"),
    "instance_event": ("the cloud reports an event on the instance", "云平台报告该实例有事件"),
    "other_node": ("the ranks here wait for a rank on another node (that node's trainmon "
                   "names it)",
                   "本节点的 rank 在等其他节点上的某个 rank（由那个节点的 trainmon 指出）"),
    "unknown": ("no signal of the node changed with it", "节点上没有同时变化的信号"),
}

ADVICE = {**ADVICE, **{
    "fail_slow": (
        "Exclude the slow rank's node before it costs the job a day: a scheduler does not "
        "see a half-broken node by itself (Slurm: --exclude=NODE, scontrol update "
        "NodeName=NODE State=DRAIN; Kubernetes: kubectl cordon NODE). `trainmon suspects "
        "--prometheus URL` lists the fleet's odd nodes out with the commands; check the "
        "node's GPU clocks, throttling and health (trainmon_health_status).",
        "在它拖慢整个任务一天之前把慢 rank 所在节点排除掉：故障节点一定要主动 exclude，调度器"
        "不会自动识别“半坏”节点（Slurm：--exclude=NODE、scontrol update NodeName=NODE "
        "State=DRAIN；Kubernetes：kubectl cordon NODE）。`trainmon suspects --prometheus URL` "
        "会列出集群里的异常节点和命令；并检查该节点的 GPU 频率、降频和健康状态"
        "（trainmon_health_status）。"),
    "mixed_gpus": (
        "Keep a job on one GPU generation and clock class: schedule it to a partition (Slurm "
        "--constraint, a Kubernetes nodeSelector on nvidia.com/gpu.product) of identical "
        "GPUs; mixed, the slower GPUs hold back every synchronous step of the whole job.",
        "分区内不要混用不同代际的 GPU：把任务调度到同型号 GPU 的分区（Slurm --constraint、"
        "Kubernetes 按 nvidia.com/gpu.product 设置 nodeSelector），"
        "否则慢卡会拖累整个并行任务的每一步。"),
    "fail_slow_cpu_throttled": (
        "Raise or remove the CPU limit of the rank's container or cgroup (Kubernetes: "
        "resources.limits.cpu, whole CPUs with Guaranteed QoS for training pods), or move "
        "the other work off its CPUs; then the rank runs at its own speed again.",
        "调高或去掉该 rank 所在容器或 cgroup 的 CPU 限额（Kubernetes：resources.limits.cpu，"
        "训练 pod 用整数个 CPU 的 Guaranteed QoS），或把其他负载移出它的 CPU。"),
    "fail_slow_gpu_thermal": (
        "The GPU is held down for heat: nvidia-smi -q -d PERFORMANCE,TEMPERATURE shows the "
        "throttle reasons; check the node's fans, airflow and inlet temperature, and drain "
        "it if one GPU alone runs hot (a hardware fault slows the whole synchronous job).",
        "GPU 因过热降频：nvidia-smi -q -d PERFORMANCE,TEMPERATURE 可以看到降频原因；检查节点"
        "风扇、风道和进风温度，若只有这一块 GPU 过热，请将节点下线（一块慢卡拖慢整个同步任务）。"),
    "fail_slow_gpu_power_cap": (
        "The GPU is held at its power cap: nvidia-smi -q -d POWER shows the enforced limit; "
        "restore it (nvidia-smi -pl) or drain the node if its power delivery is at fault.",
        "GPU 触及功耗上限：nvidia-smi -q -d POWER 可以看到生效的功耗上限；恢复它"
        "（nvidia-smi -pl），若是节点供电问题，请将节点下线。"),
    "fail_slow_gpu_clocks": (
        "The GPU's clocks dropped: nvidia-smi -q -d CLOCK,PERFORMANCE shows why (application "
        "clocks, a clock lock, throttling); reset them (nvidia-smi -rac, -rgc) or drain the "
        "node.",
        "GPU 频率下降了：nvidia-smi -q -d CLOCK,PERFORMANCE 可以看到原因（应用频率、锁频、降频）；"
        "恢复频率（nvidia-smi -rac、-rgc）或将节点下线。"),
    "fail_slow_pcie_link": (
        "The GPU's PCIe link degraded (nvidia-smi -q -d PCI: link width and generation "
        "against their maximum): reseat or replace the GPU or riser; drain the node until "
        "then.",
        "GPU 的 PCIe 链路降级了（nvidia-smi -q -d PCI：当前链路宽度和代数对比最大值）：重新插拔"
        "或更换 GPU、转接卡；在此之前请将节点下线。"),
    "fail_slow_network_errors": (
        "The node's links count errors: ibstat and perfquery (symbol and link errors), "
        "ethtool -S; replace the cable or transceiver, and drain the node until then.",
        "节点链路在报错：用 ibstat、perfquery（symbol/link 错误）、ethtool -S 检查；更换线缆或"
        "光模块，在此之前请将节点下线。"),
    "fail_slow_cpu_pressure": (
        "Other work competes for the node's CPUs (/proc/pressure/cpu): move it away, or "
        "give the training processes their own CPUs (cpusets, Guaranteed QoS).",
        "节点上有其他负载在争抢 CPU（/proc/pressure/cpu）：把它移走，或为训练进程分配独占 CPU"
        "（cpuset、Guaranteed QoS）。"),
    "fail_slow_cpu_steal": (
        "The hypervisor gives this instance's CPUs to others (steal time): on a cloud, move "
        "the job to another instance or a dedicated host.",
        "宿主机把这台实例的 CPU 时间分给了别人（steal）：在云上请把任务迁到其他实例或专用宿主机。"),
    "fail_slow_mount_latency": (
        "The dataset's network filesystem answers slower (nfsiostat: READ round trips): "
        "other jobs may read the same storage; warm the dataset onto local NVMe before "
        "training and read it from there.",
        "数据集所在的网络文件系统变慢了（nfsiostat：READ 往返时间）：可能有其他任务在读同一份"
        "存储；训练前先把数据集预热到本地 NVMe 再读。"),
    "fail_slow_data_loading": (
        "The data loading got slower mid-run: a slower shard or dataset region, a cache that "
        "stopped hitting, or fewer loader workers; raise num_workers and prefetch_factor, "
        "and warm the dataset onto local NVMe.",
        "训练中途数据加载变慢了：可能是更慢的分片或数据区域、缓存不再命中，或 loader worker "
        "变少；增大 num_workers 和 prefetch_factor，并把数据集预热到本地 NVMe。"),
    "fail_slow_instance_event": (
        "The cloud reports an event on the instance (a fault, maintenance or migration): "
        "checkpoint now and move the job to another instance.",
        "云平台报告该实例有事件（故障、运维或迁移）：立即保存 checkpoint，把任务迁到其他实例。"),
    "fail_slow_other_node": (
        "The job waits for a rank on another node: `trainmon suspects --prometheus URL` (or "
        "`trainmon doctor` on each of the job's nodes) names it.",
        "任务在等其他节点上的某个 rank：用 `trainmon suspects --prometheus URL`"
        "（或在任务的每个节点上运行 `trainmon doctor`）找到它。"),
}}
ADVICE_ALIASES = {"sawtooth_data_wait": "data_wait", "gpu_bound_unmeasured": "gpu_bound",
                  "idle_held_allocated": "idle_held",
                  "fail_slow_pcie_replays": "fail_slow_pcie_link"}
#: Findings whose advice is added to the deciding finding's, wherever they stand.
EXTRA_ADVICE = ("oom_risk", "spot_reclaim", "checkpoint_overdue", "checkpoint_missing",
                "checkpoint_local_disk", "numa_far", "nccl_over_sockets", "fail_slow",
                "mixed_gpus")

#: Added to a storage finding whose data comes from an NFS/CFS mount
#: (``risks.with_storage_source``), with and without a READ round trip.
STORAGE_SOURCE_NOTE: Pair = (
    "; dataset read from CFS/NFS {source} at {mount}: {read_bytes_per_second_text}, "
    "{read_rtt_milliseconds:.0f} ms per READ",
    "；数据集从 CFS/NFS {source}（挂载于 {mount}）读取：{read_bytes_per_second_text}，"
    "每次 READ {read_rtt_milliseconds:.0f} 毫秒")
STORAGE_SOURCE_NOTE_NO_RTT: Pair = (
    "; dataset read from CFS/NFS {source} at {mount}: {read_bytes_per_second_text}",
    "；数据集从 CFS/NFS {source}（挂载于 {mount}）读取：{read_bytes_per_second_text}")
#: Added to a checkpoint finding while a reclaim is scheduled.
RECLAIM_NOTE: Pair = (
    "; the instance is reclaimed in {reclaim_seconds:.0f} s",
    "；实例将在 {reclaim_seconds:.0f} 秒后被回收")

#: Added to a communication finding whose GPUs look busy with idle SMs (GPM).
NCCL_BUSY_NOTE: Pair = (
    "; the GPUs look {utilization:.0%} busy but their SMs are active only {sm_active:.0%}: "
    "that busy time is communication kernels, not compute",
    "；GPU 利用率显示 {utilization:.0%}，但 SM 只有 {sm_active:.0%} 在活跃："
    "这些繁忙时间是通信 kernel，不是计算")

NCCL_PROBLEMS: Mapping[str, Pair] = {
    "ib_disabled_with_rdma": (
        "{variable}={value} while RDMA ports are active: NCCL sends over TCP sockets; unset it.",
        "{variable}={value}，但节点有可用的 RDMA 端口：NCCL 会走 TCP；请去掉该设置。"),
    "socket_ifname_not_found": (
        "{variable}={value} names an interface the process does not have.",
        "{variable}={value} 指定的网卡在该进程中不存在。"),
    "ib_hca_not_found": (
        "{variable}={value} names an HCA or port that does not exist on this node.",
        "{variable}={value} 指定的 HCA 或端口在本节点不存在。"),
    "no_rdma_ib_enabled": (
        "no active RDMA port, and IB is not disabled: NCCL silently falls back to sockets; set "
        "NCCL_IB_DISABLE=1 to make it explicit, or give the pod its RDMA device.",
        "节点没有可用的 RDMA 端口，却没有关闭 IB：NCCL 会悄悄退回 TCP；"
        "请显式设置 NCCL_IB_DISABLE=1，"
        "或为 pod 分配 RDMA 设备。"),
    "debug_logging": (
        "{variable}={value}: verbose NCCL logging on every rank; use WARN outside debugging.",
        "{variable}={value}：每个 rank 都在输出详细的 NCCL 日志；非调试时请改为 WARN。"),
}


def pick(pair: Pair, lang: str) -> str:
    return pair[1] if lang == "zh" else pair[0]


def render(template: str, values: Mapping[str, object]) -> str:
    """``template.format(**values)``; a template/value mismatch never breaks the report."""
    try:
        return template.format(**values)
    except (KeyError, ValueError, TypeError) as error:
        log.debug("cannot format %r with %r: %s", template, values, error)
        return template


def word(key: str, lang: str) -> str:
    return pick(WORDS[key], lang)


def history_text(key: str, lang: str, **values: object) -> str:
    """A line or clause of the run history (``HISTORY``), numbers made plural as in
    ``count_text``."""
    return render(pick(HISTORY[key], lang), _with_derived_values(values))


def end_word(reason: str | None, lang: str) -> str:
    """How a run ended, in words (``running`` for None)."""
    key = reason or "running"
    return pick(END_WORDS.get(key, (key, key)), lang)


def ago_text(seconds: float, lang: str) -> str:
    """``40 s ago``, ``12 min ago``, ``2 h ago``, ``3 d ago`` (rounded down past a minute)."""
    seconds = max(0.0, seconds)
    for key, unit, below in (("seconds", 1.0, 60.0), ("minutes", 60.0, 3600.0),
                             ("hours", 3600.0, 86400.0)):
        if seconds < below:
            return render(pick(AGO[key], lang), {"value": seconds // unit})
    return render(pick(AGO["days"], lang), {"value": seconds // 86400.0})


def reason_text(code: str, lang: str, values: Mapping[str, object] | None = None) -> str:
    """Why nothing could be measured (``REASONS``), in ``lang``."""
    pair = REASONS.get(code)
    return code if pair is None else render(pick(pair, lang), values or {})


def kind_name(kind: str, lang: str) -> str:
    return pick(KIND_NAMES.get(kind, (kind, kind)), lang)


def severity_tag(severity: str, lang: str) -> str:
    """``CRITICAL``/``严重`` for a risk finding's severity; an unknown one upper-cased."""
    return pick(SEVERITY_TAGS.get(severity, (severity.upper(), severity.upper())), lang)


def storage_name(storage: str, lang: str) -> str:
    """A checkpoint storage kind in words (English: the label value, ``local_disk``)."""
    return pick(STORAGE_NAMES.get(storage, (storage, storage)), lang)


def provider_name(provider: str, lang: str) -> str:
    return pick(PROVIDER_NAMES.get(provider, (provider, provider)), lang)


def heading(key: str, lang: str, **values: object) -> str:
    return render(pick(HEADINGS[key], lang), values)


#: Which parallelism dimension waits, after a ``comm_exposed`` finding.
COMM_GROUP_NOTE: Pair = ("; most of it in the {group} group",
                         "；主要在 {group} 组的通信中")


def finding_text(code: str, values: Mapping[str, object], lang: str) -> str:
    if code == "gpu_bound" and "utilization" not in values:
        code = "gpu_bound_unmeasured"
    if code == "idle_held" and not values.get("pids"):
        code = "idle_held_allocated"
    if code == "hung_rank":
        code, values = _hung_rank_text(values, lang)
    if code == "fail_slow":
        values = fail_slow_values(values, lang)
    values = _with_derived_values(values)
    if isinstance(values.get("storage"), str):
        values = {**values, "storage": storage_name(str(values["storage"]), lang)}
    pair = FINDINGS.get(code)
    text = render(pick(pair, lang), values) if pair else code
    if code in ("comm_exposed", "comm_phase") and "sm_active" in values:
        text += render(pick(NCCL_BUSY_NOTE, lang), values)
    if code == "comm_exposed" and values.get("group"):
        text += render(pick(COMM_GROUP_NOTE, lang), values)
    if "mount" in values:
        note = STORAGE_SOURCE_NOTE if "read_rtt_milliseconds" in values else (
            STORAGE_SOURCE_NOTE_NO_RTT)
        text += render(pick(note, lang), values)
    if code.startswith("checkpoint_") and "reclaim_seconds" in values:
        text += render(pick(RECLAIM_NOTE, lang), values)
    return text


def advice_text(code: str, lang: str, values: Mapping[str, object] | None = None) -> str:
    """The next step of a finding, its template filled from the finding's ``values``
    (a hung rank's by where it is)."""
    if code == "hung_rank" and values is not None:
        code = f"hung_rank_{values.get('where', '')}"
        values = _hung_rank_text(values, lang)[1]
    if code == "comm_exposed" and values is not None and values.get("group") == "tp":
        code = "comm_exposed_tp"
    if code == "fail_slow" and values is not None:
        cause = f"fail_slow_{values.get('cause', '')}"
        if ADVICE_ALIASES.get(cause, cause) in ADVICE:
            code = cause
    pair = ADVICE.get(ADVICE_ALIASES.get(code, code))
    if not pair:
        return ""
    return render(pick(pair, lang), _with_derived_values(values or {}))


def fail_slow_values(values: Mapping[str, object], lang: str) -> Mapping[str, object]:
    """A ``fail_slow`` finding's values with the words its message needs: ``who`` (``rank
    1``, ``the job``), ``start_text`` (``10:42:05 UTC``), ``part_words``, ``cause_words``
    and ``growth_text`` (`` from 102 ms to 141 ms``, where the finding carries them)."""
    rank = str(values.get("rank", ""))
    start = values.get("start")
    before, after = values.get("before"), values.get("after")
    growth = ""
    if isinstance(before, (int, float)) and isinstance(after, (int, float)) and after:
        growth = pick((f" from {before * 1000:.0f} ms to {after * 1000:.0f} ms",
                       f"（从 {before * 1000:.0f} 毫秒到 {after * 1000:.0f} 毫秒）"), lang)
    part, cause = str(values.get("part", "")), str(values.get("cause", ""))
    return {**values,
            "who": pick((f"rank {rank}", f"rank {rank} ") if rank else ("the job", "整个任务"),
                        lang),
            "start_text": time.strftime("%H:%M:%S UTC", time.gmtime(float(start)))
            if isinstance(start, (int, float)) and start > 0 else "?",
            "part_words": pick(FAIL_SLOW_PARTS.get(part, (part, part)), lang),
            "cause_words": pick(FAIL_SLOW_CAUSES.get(cause, (cause, cause)), lang),
            "growth_text": growth + (pick((f", most of it in the {values['group']} group",
                                           f"，主要在 {values['group']} 组"), lang)
                                     if values.get("group") else "")}


def rate_text(value: float | None) -> str:
    """Bytes per second in decimal units (as link rates are quoted)."""
    if value is None:
        return "n/a"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B/s"


#: A hung job's rank, one line each: where it is, its collective, its frame.
HUNG_RANK_LINE: Pair = ("rank {rank}: {where_words}{collective_text}{frame_text}, {seconds} s",
                        "rank {rank}：{where_words}{collective_text}{frame_text}，{seconds} 秒")
HUNG_GONE_LINE: Pair = ("rank {rank}: gone, silent for {seconds} s",
                        "rank {rank}：已不在，{seconds} 秒没有上报")


def hung_rank_entries(values: Mapping[str, object]
                      ) -> list[tuple[str, str, str, str, str, str]]:
    """``(rank, where, collective, seq, frame, seconds)`` of each rank of a ``hung_rank``
    finding (its ``ranks`` value: ``rank|where|collective|seq|frame|seconds;…``)."""
    entries = []
    for entry in filter(None, str(values.get("ranks", "")).split(";")):
        rank, where, collective, seq, frame, seconds = (entry.split("|") + [""] * 6)[:6]
        entries.append((rank, where, collective, seq, frame, seconds))
    return entries


def hung_rank_lines(values: Mapping[str, object], lang: str) -> list[str]:
    """``rank 1: in its data loader's next() → dataset.py:42 __getitem__, 47 s`` for each
    rank of a ``hung_rank`` finding (its ``ranks`` value)."""
    lines = []
    for rank, where, collective, seq, frame, seconds in hung_rank_entries(values):
        if where == "gone":
            lines.append(render(pick(HUNG_GONE_LINE, lang), {"rank": rank,
                                                              "seconds": seconds}))
            continue
        words = HUNG_WHERE.get(where)
        named = f" {collective} #{seq}" if collective and seq else (
            f" {collective}" if collective else "")
        lines.append(render(pick(HUNG_RANK_LINE, lang), {
            "rank": rank, "seconds": seconds,
            "where_words": where if words is None else render(pick(words, lang),
                                                              {"phase": "?"}),
            "collective_text": named, "frame_text": f" → {frame}" if frame else ""}))
    return lines


def _hung_rank_text(values: Mapping[str, object], lang: str
                    ) -> tuple[str, Mapping[str, object]]:
    """The message of a ``hung_rank`` finding by where the rank is, and its values with
    the words they need: ``where_words``, ``frame_text`` (`` → dataset.py:42
    __getitem__``), ``waiting_text`` (``; rank(s) 0 wait in all_reduce #311 for 47 s``)."""
    where = str(values.get("where", ""))
    code = {"gone": "hung_rank_gone", "elsewhere": "hung_rank_elsewhere"}.get(where,
                                                                             "hung_rank")
    phase = str(values.get("phase", "")) or "?"
    words = HUNG_WHERE.get(where)
    frame = str(values.get("frame", ""))
    waiting = str(values.get("waiting", ""))
    waiting_text = ""
    if waiting:
        collective = str(values.get("collective", "")) or pick(("a collective", "集合通信"),
                                                               lang)
        seq = str(values.get("seq", ""))
        named = f"{collective} #{seq}" if seq else collective
        seconds = float(values.get("seconds", 0.0) or 0.0)  # type: ignore[arg-type]
        waiting_text = pick((f"; rank(s) {waiting} wait in {named} for {seconds:.0f} s",
                             f"；rank {waiting} 在 {named} 中等待了 {seconds:.0f} 秒"), lang)
    return code, {**values, "phase": phase,
                  "where_words": "" if words is None else render(pick(words, lang),
                                                                 {"phase": phase}),
                  "frame_text": f" → {frame}" if frame else "",
                  "waiting_text": waiting_text}


def _with_derived_values(values: Mapping[str, object]) -> Mapping[str, object]:
    """``values`` plus ``<key>_text`` for each ``*_bytes_per_second`` number (``180.0 MB/s``)
    and ``<key>_plural`` for each number (``""`` where it shows as ``1`` with ``:.0f``, else
    ``"s"``)."""
    numbers = {key: value for key, value in values.items()
               if isinstance(value, (int, float)) and not isinstance(value, bool)}
    derived = {f"{key}_text": rate_text(value) for key, value in numbers.items()
               if key.endswith("_bytes_per_second")}
    derived.update({f"{key}_plural": "" if f"{value:.0f}" == "1" else "s"
                    for key, value in numbers.items()})
    return {**values, **derived} if derived else values


def nccl_text(problem: str, variable: str, value: str, lang: str) -> str:
    pair = NCCL_PROBLEMS.get(problem)
    if pair is None:
        return problem
    return render(pick(pair, lang), {"variable": variable, "value": value})
