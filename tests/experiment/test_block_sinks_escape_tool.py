"""tools/block_sinks_escape.py: escape steps and paired contrasts of a planted block-sinks study (no data)."""

from __future__ import annotations

import json
import math

from helpers import _load_tool

PLATEAU = {"train_entropy": 6.4, "probe_cross_entropy": 6.4, "train_tokens": 1, "probe_tokens": 1}  # threshold 6.0


def _run(study, name, escape_at, last=1000, done=True):
    """A run whose logged loss (every 50 steps) is 7.0 before `escape_at` and 5.0 from it (None: never escapes)."""
    train = study / "runs" / name / "train"
    train.mkdir(parents=True)
    rows = [{"step": s, "loss": 5.0 if escape_at is not None and s >= escape_at else 7.0, "lr": 1e-3}
            for s in range(50, last + 1, 50)]
    (train / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if done:
        (train / "DONE.json").write_text(json.dumps({"step": last}))


def test_escape_steps_pairs_and_files(tmp_path):
    tool = _load_tool("block_sinks_escape")
    study = tmp_path / "study"
    _run(study, "vanilla-s1", 400)
    _run(study, "sink1-front-s1", 200)
    _run(study, "vanilla-s2", 300)
    _run(study, "sink1-front-s2", None)  # censored at its last logged step
    _run(study, "block4-s1", 800)
    _run(study, "block4-s2", None, last=100, done=False)  # still training: left out (too few rows for the window too)
    result = tool.summarize(study, PLATEAU, window=1)
    assert result["exploratory"] is True and result["runs_in"] == 5 and result["runs_total"] == 60
    assert math.isclose(result["rule"]["threshold"], 6.0) and result["rule"]["window_logged_losses"] == 1
    runs = result["runs"]
    assert set(runs) == {"vanilla-s1", "sink1-front-s1", "vanilla-s2", "sink1-front-s2", "block4-s1"}
    assert {k: (r["step"], r["censored"]) for k, r in runs.items()} == {
        "vanilla-s1": (400, False), "sink1-front-s1": (200, False), "vanilla-s2": (300, False),
        "sink1-front-s2": (1000, True), "block4-s1": (800, False)}
    c = result["contrasts"]
    assert list(c) == ["sink1-front − vanilla", "block16-sink1 − block16", "block4-sink1 − block4",
                       "block4 − vanilla", "block16 − vanilla"]
    sink = c["sink1-front − vanilla"]
    assert sink["seeds"] == 2 and sink["per_seed"] == {"1": -1.0, "2": math.log2(1000 / 300)}
    assert sink["censored"] == {"1": [False, False], "2": [True, False]}
    assert (sink["plus"], sink["minus"], sink["ties"], sink["undetermined"]) == (1, 1, 0, 0)  # the bound orders s2
    assert sink["p"] == 1.0
    block4 = c["block4 − vanilla"]  # seed 2's block4 run has not finished: only seed 1 is paired
    assert block4["seeds"] == 1 and block4["per_seed"] == {"1": 1.0}
    assert c["block16 − vanilla"]["seeds"] == 0 and c["block16 − vanilla"]["p"] is None
    # a trailing mean of 3 logged losses (7, 5, 5 -> 5.67 < 6) crosses one log row after the loss does
    assert tool.summarize(study, PLATEAU, window=3)["runs"]["vanilla-s1"]["step"] == 450
    tool.write(tmp_path / "out", result)
    stored = json.loads((tmp_path / "out" / "escape.json").read_text())
    assert {"exploratory", "study", "rule", "runs_in", "runs_total", "runs", "contrasts"} <= set(stored)
    assert stored["runs"]["sink1-front-s2"]["censored"] is True
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "exploratory" in readme and "5 of 60 runs" in readme and "s2 ≥+1.74" in readme
