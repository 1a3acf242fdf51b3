"""One measured run, written once for every target: prepare → reset → probes → warm-up → the load → closing
sample → summary, each step its driver's (:class:`pglab.engine.driver.MeasuredRun`), each a phase of the run."""

from __future__ import annotations

from collections.abc import Callable

from pglab.engine.driver import MeasuredRun
from pglab.engine.types import RunResult


def measure(run: MeasuredRun, mark: Callable[[str], None]) -> RunResult:
    """Run ``run``'s steps in order, ``mark`` each phase as it begins, and ``end`` the run whatever happened (a
    failure, an interrupt from a wait that saw the signal): the result, or the step's exception."""
    try:
        run.prepare()
        for phase, step in (("reset", "reset"), ("probes", "start_probes")):
            if _has(run, step):
                mark(phase)
                getattr(run, step)()
        if run.warmup_s > 0 and _has(run, "warm_up"):
            mark("warm-up")
            run.warm_up()
        mark(run.load_phase)
        run.measure()
        if _has(run, "close_probes"):
            mark("closing-tick")
            run.close_probes()
        mark("summary")
        result = run.summarize()
    except BaseException as exc:
        run.end(exc)
        raise
    run.end(None)
    return result


def _has(run: MeasuredRun, step: str) -> bool:
    """Whether the target has this step (a step left as the base class has it is no phase of its runs)."""
    return getattr(type(run), step) is not getattr(MeasuredRun, step)
