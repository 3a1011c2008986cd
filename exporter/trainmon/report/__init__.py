"""The diagnosis as a report for people: its model, its JSON and text, its words.

Above the engine (``trainmon.diagnosis``), which returns dataclasses and has no
words: ``model`` runs the engine over a window and keeps its results with what
the report derives from them (a GPU's job, a checkpoint's age, the status and
exit code); ``document`` writes that as the ``doctor --json`` document, field
by field from the engine's dataclasses; ``render`` as text; ``messages`` is the
English and Chinese catalogue both take their words from. ``trainmon.doctor``,
the command, sits on top.
"""

from trainmon.report.document import report_json
from trainmon.report.model import EXIT_CODES, Report, Source, build_report, unmeasured_report
from trainmon.report.render import render_text

__all__ = [
    "EXIT_CODES",
    "Report",
    "Source",
    "build_report",
    "render_text",
    "report_json",
    "unmeasured_report",
]
