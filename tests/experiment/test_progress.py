"""experiment/progress.py: the page an unfinished experiment keeps up to date."""

from __future__ import annotations


def test_progress_prices_what_is_left_at_the_measured_rates(tmp_path):
    """progress.md's "Left" line: steps and sequences still to do, times the median measured rate per step
    (finished runs' training seconds / steps) and per sequence (the scoring seconds val.partial.json keeps with
    its values / sequences scored, so a model being validated prices the rest before it finishes)."""
    import json

    from sinkdlm.experiment.progress import write_progress

    for seed, (done, step, secs, scored, vsecs) in enumerate([(True, 10, 50.0, 4, 20.0), (True, 10, 70.0, 2, 14.0),
                                                              (False, 4, None, 0, None)]):
        run = tmp_path / "runs" / f"vanilla-s{seed}"
        (run / "train").mkdir(parents=True)
        (run / "train" / "metrics.jsonl").write_text(json.dumps({"step": step, "loss": 3.0, "grad_norm": 1.0}) + "\n")
        if done:
            (run / "train" / "DONE.json").write_text("{}")
        (run / "timing.json").write_text(json.dumps({"train": secs}))
        if scored:
            (run / "val.partial.json").write_text(json.dumps({"key": {}, "values": [[1.0, 2.0]] * scored,
                                                              "seconds": vsecs}))
    text = write_progress(tmp_path, "t", {"vanilla": "DLM"}, [0, 1, 2], 10, 8).read_text()
    # training: 6 steps left at median(5, 7) = 6 s; validation: 4 + 6 + 8 = 18 sequences at median(5, 7) = 6 s
    assert "training 6 steps, about 1 min at 6.0 s each" in text
    assert "fixed validation 18 sequences, about 2 min at 6.0 s each" in text


def test_progress_prices_fast_steps_with_their_significant_digits():
    """A tiny model's step takes a fraction of a second: the rate keeps two significant digits, not "0.0 s"."""
    from sinkdlm.experiment.progress import _remaining

    text = _remaining(368_500, [0.093, 0.095], 7_936, [0.04])
    assert "training 368,500 steps, about 9.6 h at 0.094 s each" in text  # 368,500 x 0.094 s = 34,639 s
    assert "fixed validation 7,936 sequences, about 5 min at 0.04 s each" in text  # 317 s


def test_progress_counts_a_finished_run_whose_weights_are_gone_as_training_left(tmp_path):
    """A study directory committed without its weights: a finished run with its validation unfinished is
    trained again (units.train_stage), so the page says so and prices its steps; a fully measured run
    without weights needs nothing."""
    import json

    from sinkdlm.experiment.progress import write_progress

    for seed, validated in ((0, True), (1, False)):
        run = tmp_path / "runs" / f"vanilla-s{seed}"
        (run / "train").mkdir(parents=True)
        (run / "train" / "metrics.jsonl").write_text(json.dumps({"step": 10, "loss": 3.0, "grad_norm": 1.0}) + "\n")
        (run / "train" / "DONE.json").write_text(json.dumps({"out": "/elsewhere/train",
                                                             "checkpoint": "/elsewhere/train/checkpoints/step-10"}))
        (run / "timing.json").write_text(json.dumps({"train": 40.0}))
        if validated:
            (run / "val.json").write_text(json.dumps({"values": [[1.0, 2.0]] * 8, "seconds": 16.0}))
    text = write_progress(tmp_path, "t", {"vanilla": "DLM"}, [0, 1], 10, 8).read_text()
    assert "| DLM | 0 | 10/10 (done) |" in text
    assert "| DLM | 1 | 10/10 (done; weights gone: trains again) |" in text
    assert "training 10 steps, about 1 min at 4.0 s each" in text


def test_interim_head_start_on_the_sequences_all_four_models_scored(tmp_path):
    """`head_start_splits`: per seed, the step-0 gap mean(a0 - b0) and Δ_train mean((aT - a0) - (bT - b0)) over
    the first N sequences that the two runs and the two step-0 controls have all scored (a seed with fewer is
    left out, as for the end values); written out here with numpy on random values."""
    import json

    import numpy as np
    import pytest

    from sinkdlm.experiment.variance import head_start_splits

    rng = np.random.default_rng(0)
    vals, dirs = {}, {}
    scored = {("a", "T", 0): 6, ("a", 0, 0): 8, ("b", "T", 0): 8, ("b", 0, 0): 8,  # seed 0: 6 in common
              ("a", "T", 1): 6, ("a", 0, 1): 6, ("b", "T", 1): 7, ("b", 0, 1): 6,  # seed 1: 6 in common
              ("a", "T", 2): 3, ("a", 0, 2): 8, ("b", "T", 2): 8, ("b", 0, 2): 8}  # seed 2: behind, left out
    for (v, k, s), n in scored.items():
        d = tmp_path / ("runs" if k == "T" else "step0") / f"{v}-s{s}"
        d.mkdir(parents=True)
        vals[v, k, s] = rng.normal(3 + (k == 0), 0.5, size=(n, 2))
        (d / "val.partial.json").write_text(json.dumps({"key": {}, "values": vals[v, k, s].tolist()}))
        if k == 0:
            dirs[v, s] = d
    (h,) = head_start_splits(tmp_path, [("a", "b")], [0, 1, 2], None, dirs)  # None: any validation key
    assert h["seeds"] == 2 and h["sequences"] == 6
    for s in (0, 1):
        v = {key: x[:6] for key, x in vals.items() if key[2] == s}
        assert h["step0_gap"]["per_seed"][str(s)] == pytest.approx((v["a", 0, s] - v["b", 0, s]).mean())
        want = ((v["a", "T", s] - v["a", 0, s]) - (v["b", "T", s] - v["b", 0, s])).mean()
        assert h["training_effect"]["per_seed"][str(s)] == pytest.approx(want)
    gaps = list(h["step0_gap"]["per_seed"].values())
    assert h["step0_gap"]["mean"] == pytest.approx(np.mean(gaps))
    half = 12.706 * np.std(gaps, ddof=1) / np.sqrt(2)  # t_{0.975, 1}
    assert h["step0_gap"]["high"] - h["step0_gap"]["mean"] == pytest.approx(half, rel=1e-3)


def test_progress_divides_the_time_left_among_runs_training_side_by_side(tmp_path):
    """Shards train runs side by side: a run whose metrics log was written in the last 10 minutes is being trained,
    and with 2 such runs the wall time left is the one-process time over 2; a stale unfinished run (its process
    gone) does not count."""
    import json
    import os
    import time

    from sinkdlm.experiment.progress import write_progress

    for seed, (done, step, age) in enumerate([(True, 10, 0), (False, 4, 5), (False, 6, 30), (False, 0, 3600)]):
        run = tmp_path / "runs" / f"vanilla-s{seed}"
        (run / "train").mkdir(parents=True)
        log = run / "train" / "metrics.jsonl"
        log.write_text(json.dumps({"step": step, "loss": 3.0, "grad_norm": 1.0}) + "\n")
        os.utime(log, (time.time() - age, time.time() - age))
        if done:
            (run / "train" / "DONE.json").write_text("{}")
            (run / "timing.json").write_text(json.dumps({"train": 3600.0}))  # 360 s a step
    text = write_progress(tmp_path, "t", {"vanilla": "DLM"}, [0, 1, 2, 3], 10).read_text()
    # left: 6 + 4 + 10 = 20 steps x 360 s = 2.0 h of one process; seeds 1 and 2 are training: 1.0 h of wall time
    assert "training 20 steps, about 2.0 h at 360.0 s each" in text
    assert "2 runs are training side by side now" in text and "takes about 1.0 h of wall time" in text
    os.utime(tmp_path / "runs" / "vanilla-s2" / "train" / "metrics.jsonl", (time.time() - 3600,) * 2)
    assert "side by side" not in write_progress(tmp_path, "t", {"vanilla": "DLM"}, [0, 1, 2, 3], 10).read_text()
