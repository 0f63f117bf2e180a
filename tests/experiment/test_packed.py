"""A study's per-run arrays packed into one file (`experiment/packed.py`): every packed file reads back exactly as it
was written (values and types), the readers that need the arrays get them from the pack, a file that would not read
back exactly stays whole, and the study takes less room."""

from __future__ import annotations

import json

import numpy as np

from sinkdlm.experiment.packed import PACK, pack_study, read_run_json


def _study(tmp_path):
    """Two runs with a fixed validation (one with a scored step of its curve), a step-0 control, one escape run's
    probes (the sink-token mass null at every probe: a vanilla run), and a val.json whose values are ragged."""
    rng = np.random.default_rng(0)
    files = {}

    def val(n, d):
        return {"val_loss": float(rng.normal(5, 0.1)), "val_loss_se": 0.01, "tokens": n * 128, "draws": d,
                "noise_seed": 0, "per_sequence": rng.normal(5, 1, n).tolist(), "draw_variance": 0.25,
                "values": rng.normal(5, 1, (n, d)).tolist(), "seconds": 1.5}

    for rel in ("runs/a-s0/val.json", "runs/a-s0/curve/step-100/val.json", "runs/b-s0/val.json", "step0/a/val.json"):
        files[rel] = val(16, 4)
    files["runs/b-s1/val.json"] = {**val(4, 2), "values": [[1.0, 2.0], [3.0]]}  # ragged: cannot be an array
    files["runs/a-s0/escape/probes.json"] = {
        "plateau": {"probe_cross_entropy": 6.35, "train_tokens": 100}, "threshold": 5.95,
        "probes": {str(s): {"loss": float(6.4 - s / 1000), "loss_se": 0.02, "sink_token_mass": None,
                            "detected_sink_mass": rng.uniform(0, 1, 4).tolist(), "seconds": 0.5}
                   for s in range(100, 1100, 100)}}
    for rel, record in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2))
    return files


def test_packed_files_read_back_exactly_and_the_readers_use_the_pack(tmp_path):
    from sinkdlm.experiment.endpoints.escape.probe import escape_record
    from sinkdlm.experiment.presets import Escape
    from sinkdlm.experiment.variance import validation_values

    files = _study(tmp_path)
    probes = tmp_path / "runs/a-s0/escape/probes.json"
    want_escape = escape_record(probes, [], Escape(pair=("a", "b")))
    sizes = sum((tmp_path / rel).stat().st_size for rel in files)
    packed, before, after = pack_study(tmp_path)
    assert packed == 5 and before == sizes and after < before
    for rel, record in files.items():
        got = read_run_json(tmp_path / rel)
        # the same values and types (keys may come back in another order)
        assert json.dumps(got, sort_keys=True) == json.dumps(record, sort_keys=True), rel
    on_disk = json.loads((tmp_path / "runs/a-s0/val.json").read_text())
    assert "values" not in on_disk and on_disk["packed"] == f"../../{PACK}" and on_disk["val_loss"] == files["runs/a-s0/val.json"]["val_loss"]
    assert "values" in json.loads((tmp_path / "runs/b-s1/val.json").read_text())  # ragged: left whole
    with np.load(tmp_path / PACK) as z:  # what a reader finds by hand
        assert np.array_equal(z["runs/a-s0/val.json:values"], np.array(files["runs/a-s0/val.json"]["values"]))
        assert z["runs/a-s0/escape/probes.json:step"].tolist() == list(range(100, 1100, 100))
    assert validation_values(tmp_path / "runs/b-s0") == files["runs/b-s0/val.json"]["values"]
    assert escape_record(probes, [], Escape(pair=("a", "b"))) == want_escape
    assert pack_study(tmp_path)[0] == 0  # packed already: nothing new
