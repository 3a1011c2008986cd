"""The words of ``trainmon top``'s screen that ``doctor`` has not (``trainmon.report
.messages`` has the rest): English and Chinese pairs, as ``messages.pick`` takes them.
The column headings stay with their columns (``render.COLUMNS``)."""

from __future__ import annotations

from collections.abc import Mapping

from trainmon.report.messages import Pair

WORDS: Mapping[str, Pair] = {
    "title": ("trainmon top", "trainmon top"),
    "window": ("window {seconds:.0f} s", "窗口 {seconds:.0f} 秒"),
    "unreadable": ("cannot read it: {problem} — showing data from {age} ago",
                   "读取失败：{problem}——显示的是 {age} 前的数据"),
    "no_data": ("no data yet: {problem}", "还没有数据：{problem}"),
    "waiting": ("waiting for the first snapshot…", "等待第一次采样…"),
    "goodput": ("goodput {ratio:.0%}", "有效产出 {ratio:.0%}"),
    "held": ("GPU {gpu} held by {holder} (pid {pids}): {what}",
             "GPU {gpu} 被 {holder}（进程 {pids}）占用：{what}"),
    "held_idle": ("idle", "空闲"),
    "held_busy": ("busy, no training telemetry", "在用，但没有训练遥测"),
    "no_match": ("no job matches the filter", "没有符合过滤条件的任务"),
    "keys": ("q quit  s sort:{sort}{arrow}  r reverse  / filter{filter}  m {marked}  "
             "↑↓↵ job  l 中文",
             "q 退出  s 排序:{sort}{arrow}  r 反序  / 过滤{filter}  m {marked}  "
             "↑↓↵ 任务  l English"),
    "marked_only": ("marked only", "只看有标记"),
    "marked_all": ("all ranks", "全部 rank"),
    "detail_keys": ("↵/esc back  ↑↓ scroll  p profile  l 中文  q quit",
                    "↵/esc 返回  ↑↓ 滚动  p profile  l English  q 退出"),
    "filter_prompt": ("filter (job name; ↵ apply, esc clear): ",
                      "过滤（任务名；↵ 应用，esc 清除）："),
    "too_small": ("terminal too small", "终端太小"),
    "ranks": ("ranks", "各 rank"),
    "comm_groups": ("by group", "按并行维度"),
}
#: The marks, by ``Mark.code``: ``{where}`` (``WHERE``), ``{name}``, ``{seconds}``,
#: ``{ratio}`` are the mark's.
MARK_WORDS: Mapping[str, Pair] = {
    "hung": ("HUNG {where} {seconds}", "卡住 {where} {seconds}"),
    "gone": ("GONE silent {seconds}", "失联 {seconds} 无上报"),
    "stalled": ("stalled {where} {seconds}", "停滞 {where} {seconds}"),
    "waiting": ("waits {name} {seconds}", "等待 {name} {seconds}"),
    "straggler": ("STRAGGLER ×{ratio:.2f}", "拖慢 ×{ratio:.2f}"),
    "slowest": ("slowest ×{ratio:.2f}", "最慢 ×{ratio:.2f}"),
    "fail_slow": ("fail-slow +{ratio:.0%} {name}", "变慢 +{ratio:.0%} {name}"),
}
#: Where a hung or stalled rank is, in a word (``trainmon.training.stalls``).
WHERE: Mapping[str, Pair] = {
    "data_loader": ("loader", "数据加载"), "collective": ("collective", "集合通信"),
    "checkpoint": ("checkpoint", "checkpoint"), "phase": ("phase", "阶段"),
    "code": ("code", "代码"), "missing": ("missing", "缺席"),
}
CLEARED: Pair = ("was {mark} {ago} ago", "{ago}前曾{mark}")
FOUND_HEADING: Pair = ("FOUND", "发现")
