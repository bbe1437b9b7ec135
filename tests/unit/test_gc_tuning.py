"""The operator's garbage-collector settings (gpu_operator/main.py tune_gc): what is loaded at
start-up is frozen out of every collection, and the youngest generation is collected less often."""

from __future__ import annotations

import gc

from gpu_operator.main import GC_YOUNG_THRESHOLD, tune_gc


def test_tune_gc_freezes_what_is_loaded_and_collects_the_young_less_often() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_freeze_count() > 10_000, "the imported modules' objects are frozen"
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, before[1], before[2])
        assert before[0] < GC_YOUNG_THRESHOLD
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
