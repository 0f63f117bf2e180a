"""`io.atomic.json_text`, the JSON every results file is written in: it reads back exactly what json.dumps would
(the reference), with lists of plain values on one line and everything else indented as json.dumps(indent=2)."""

from __future__ import annotations

import json
import math
import random

from sinkdlm.io.atomic import atomic_write_json, json_text


def _random_value(rng: random.Random, depth: int = 0):
    kinds = ["int", "float", "str", "bool", "none"] + (["list", "dict", "scalars"] if depth < 4 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.randint(-10**6, 10**6)
    if kind == "float":
        return rng.choice([rng.uniform(-1e3, 1e3), rng.random() * 1e-9, 1e300, -0.0, float("nan"), float("inf")])
    if kind == "str":
        return rng.choice(["", "plain", "[1,2]", "quote\"s", "new\nline", "ϵ = 3 — é", "{a: [b]}"])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "scalars":
        return [_random_value(rng, 4) for _ in range(rng.randint(0, 6))]
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = [rng.choice(["a", "b", "val_loss", "per_seed", "1", "é"]), rng.randint(0, 9), True, None, 2.5]
    return {rng.choice(keys): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def test_json_text_reads_back_as_json_dumps_writes():
    rng = random.Random(0)
    for _ in range(500):
        value = _random_value(rng)
        # equal as text after one round trip through json (NaN != NaN, so compare the canonical dumps)
        assert json.dumps(json.loads(json_text(value))) == json.dumps(json.loads(json.dumps(value))), value


def test_lists_of_plain_values_go_on_one_line_the_rest_indented(tmp_path):
    record = {"val_loss": 4.905, "per_sequence": [5.5, 5.25, math.inf], "labels": ["a", "b"],
              "values": [[1.0, 2.0], [3.0, 4.0]], "runs": [{"seed": 1}], "empty": [], "none": {}}
    text = json_text(record)
    assert text == (
        '{\n  "val_loss": 4.905,\n  "per_sequence": [5.5, 5.25, Infinity],\n  "labels": ["a", "b"],\n'
        '  "values": [\n    [1.0, 2.0],\n    [3.0, 4.0]\n  ],\n  "runs": [\n    {\n      "seed": 1\n    }\n  ],\n'
        '  "empty": [],\n  "none": {}\n}')
    path = atomic_write_json(tmp_path / "r.json", record)
    assert path.read_text() == text + "\n" and json.loads(path.read_text())["values"] == record["values"]
