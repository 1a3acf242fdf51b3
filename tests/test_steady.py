"""Dips in the per-second TPS inside the measured window."""

from __future__ import annotations

from pglab.analysis.steady import find_dips, tie_to_checkpoints


def _series(values: list[float], t0: float = 1000.0) -> list[tuple[float, float]]:
    return [(t0 + i + 1, v) for i, v in enumerate(values)]  # ts = end of each second


def test_flat_series_has_no_dip() -> None:
    assert find_dips(_series([1000, 980, 1010, 995, 1005, 990]), 1000.0, 1006.0) == []


def test_a_three_second_dip_is_found_with_its_time_and_depth() -> None:
    dips = find_dips(_series([1000, 1000, 400, 300, 500, 1000, 1000, 1000]), 1000.0, 1008.0)
    assert len(dips) == 1
    assert (dips[0].start, dips[0].end, dips[0].min_tps, dips[0].median_tps) == (1002.0, 1005.0, 300, 1000)
    assert dips[0].describe(1000.0).startswith("2-5 s: down to 300 TPS (-70 %")


def test_warm_up_seconds_before_the_window_are_not_dips() -> None:
    series = _series([100, 200, 1000, 1000, 1000, 1000])  # the first two seconds are the warm-up
    assert find_dips(series, 1002.0, 1006.0) == []
    assert len(find_dips(series, 1000.0, 1006.0)) == 1


def test_a_dip_is_tied_to_the_checkpoint_that_began_just_before_it() -> None:
    dips = find_dips(_series([1000, 1000, 1000, 1000, 400, 300, 1000, 1000, 1000, 1000, 350, 1000]), 1000.0, 1012.0)
    assert [(d.start, d.end) for d in dips] == [(1004.0, 1006.0), (1010.0, 1011.0)]
    tied = tie_to_checkpoints(dips, [990.0, 1002.5])  # the first began 14 s before the first dip: too early
    assert tied[0].checkpoint == 1002.5 and tied[1].checkpoint is None
    assert tied[0].describe(1000.0).endswith("checkpoint started at 2 s")
    assert tie_to_checkpoints(dips, [1007.0])[0].checkpoint is None  # began after the dip ended
