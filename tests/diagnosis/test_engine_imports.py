"""The diagnosis engine stands below its words: ``trainmon.diagnosis`` imports
neither the report (``trainmon.report``), nor ``doctor``, nor the run ledger's
commands (``trainmon.runs``), nor anything else above it."""

from __future__ import annotations

from tests.core.test_layering import all_modules, imports, within

ENGINE = "trainmon.diagnosis"
#: What sits above the engine: its presentation, the commands and the wiring.
ABOVE = ("trainmon.report", "trainmon.doctor", "trainmon.runs", "trainmon.collectors",
         "trainmon.cli", "trainmon.__main__")


def test_the_engine_imports_nothing_above_it() -> None:
    modules = all_modules()
    engine = [module for name, module in modules.items() if within(name, ENGINE)]
    assert {"trainmon.diagnosis.rules", "trainmon.diagnosis.platform_signals"} <= {
        module.name for module in engine}

    upward = [str(found) for module in engine for found in imports(module)
              if any(within(found.module, above) for above in ABOVE)]

    assert upward == []


def test_the_report_is_the_engine_plus_words() -> None:
    """``trainmon.report`` reads the engine and its own catalogue; the history line
    of the run ledger and the measuring stay with ``trainmon.doctor``."""
    modules = all_modules()
    report = [module for name, module in modules.items() if within(name, "trainmon.report")]
    assert report

    upward = [str(found) for module in report for found in imports(module)
              if any(within(found.module, above) for above in ABOVE[1:])]

    assert upward == []
