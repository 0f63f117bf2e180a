"""One compact file per study for its bulky per-run arrays (CONTRIBUTING.md, "What a study commits").

A committed study keeps, per run and step-0 control, the fixed validation's per-draw values (`val.json`'s `values`,
[sequences][draws], and `per_sequence`; the variance split and the paired intervals are computed from them,
docs/method.md §7) and, for an escape study, every probe's numbers (`escape/probes.json`'s `probes`, docs/method.md
§11). As JSON they are about 20 characters a number; `pack_study` moves them into the study's `per_run.npz`
(float64, exact) and leaves each JSON file with every other field plus `"packed"` (the pack's path from the
file's folder) and `"packed_key"` (the file's path in the study). A reader gets the file whole again with
`read_run_json`; by hand, `numpy.load("per_run.npz")` has one array per packed field:

* `<file>:values`, `<file>:per_sequence` for a `val.json` (`<file>` = its path in the study, e.g.
  `runs/vanilla-s100/val.json`, `runs/sink1-front-s0/curve/step-2400/val.json`, `step0/all/val.json`);
* `<file>:step` (the probed steps, in the file's order) and `<file>:probe:<field>` for a `probes.json`
  (`loss`, `loss_se`, `seconds` [probes]; `detected_sink_mass`, `content_sink_mass`, `content_sink_set_change_rate`,
  `sink_token_mass` [probes, layers]); a field that is null at every probe is named in `"null_fields"`.

A file whose read-back would differ in any value or type (a ragged list, a field null at some probes only) is
left as it was. Runs still training write whole files; packing is a commit-time step (`tools/pack_results.py`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from sinkdlm.io.atomic import atomic_write_bytes, json_text

PACK = "per_run.npz"
VAL_FIELDS = ("values", "per_sequence")


def read_run_json(path: str | Path) -> dict[str, Any]:
    """A per-run `val.json` or `probes.json` whole: as on disk, with the arrays `pack_study` moved out put back."""
    path = Path(path)
    record = json.loads(path.read_text())
    if "packed" not in record:
        return record
    with np.load(path.parent / record["packed"]) as z:
        return _restore(record, z)


def _restore(slim: dict[str, Any], arrays) -> dict[str, Any]:
    """A packed file's record with its arrays (a mapping of the pack's names to arrays) put back."""
    record = {k: v for k, v in slim.items() if k not in ("packed", "packed_key", "probe_fields", "null_fields")}
    key, nulls = slim["packed_key"], slim.get("null_fields", [])
    if "probe_fields" in slim:  # a probes.json: one row per probe, in the file's order
        steps = arrays[f"{key}:step"].tolist()
        record["probes"] = {str(step): {f: None if f in nulls else arrays[f"{key}:probe:{f}"][i].tolist()
                                        for f in slim["probe_fields"]} for i, step in enumerate(steps)}
    else:
        record.update({f: arrays[f"{key}:{f}"].tolist() for f in VAL_FIELDS if f"{key}:{f}" in arrays})
    return record


def _arrays(record: dict[str, Any], key: str) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """(arrays for the pack, what stays in the JSON file) of one record, or None when nothing is packed."""
    if "probes" in record:
        probes = record["probes"]
        if not probes:
            return None
        order = list(next(iter(probes.values())))
        nulls = [f for f in order if all(p.get(f) is None for p in probes.values())]
        arrays = {f"{key}:step": np.array([int(s) for s in probes], dtype=np.int64)}
        for f in order:
            if f not in nulls:
                arrays[f"{key}:probe:{f}"] = np.array([p[f] for p in probes.values()], dtype=np.float64)
        slim = {k: v for k, v in record.items() if k != "probes"}
        return arrays, {**slim, "probe_fields": order, "null_fields": nulls}
    arrays = {f"{key}:{f}": np.array(record[f], dtype=np.float64) for f in VAL_FIELDS if record.get(f)}
    if not arrays:
        return None
    return arrays, {k: v for k, v in record.items() if k not in VAL_FIELDS}


def study_files(study: Path) -> list[Path]:
    """The per-run files a study's pack takes: every `val.json` and `escape/probes.json` under its runs and step-0
    controls."""
    return sorted([*study.glob("runs/*/val.json"), *study.glob("runs/*/curve/*/val.json"),
                   *study.glob("step0/*/val.json"), *study.glob("runs/*/escape/probes.json")])


def pack_study(study: str | Path) -> tuple[int, int, int]:
    """Move the study's per-run arrays into `per_run.npz` (module docstring); the arrays packed before are kept.
    Returns (files packed, bytes before, bytes after: the JSON files and the pack)."""
    study = Path(study)
    pack_path = study / PACK
    arrays: dict[str, np.ndarray] = {}
    if pack_path.is_file():
        with np.load(pack_path) as z:
            arrays = {k: z[k] for k in z.files}
    files = study_files(study)
    before = sum(p.stat().st_size for p in files) + (pack_path.stat().st_size if pack_path.is_file() else 0)
    slims: dict[Path, str] = {}
    for path in files:
        record = json.loads(path.read_text())
        if "packed" in record:
            continue
        key = path.relative_to(study).as_posix()
        try:
            split = _arrays(record, key)
        except ValueError:  # ragged lists: no array holds them, the file stays whole
            continue
        if split is None:
            continue
        new, slim = split
        slim.update(packed=os.path.relpath(pack_path, path.parent), packed_key=key)
        # the read-back must equal the file as it was, every value and type (keys in any order), or it stays whole
        if json.dumps(_restore(slim, new), sort_keys=True) == json.dumps(record, sort_keys=True):
            arrays.update(new)
            slims[path] = json_text(slim)
    if not slims:
        return 0, before, before
    tmp = study / f".{PACK}.tmp.npz"
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, pack_path)  # the pack first: a file is slimmed only once its arrays are on disk
    for path, text in slims.items():
        atomic_write_bytes(path, text.encode())
    after = sum(p.stat().st_size for p in files) + pack_path.stat().st_size
    return len(slims), before, after
