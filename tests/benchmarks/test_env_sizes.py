"""benchmarks/bench_env_sizes.py builds each environment by the Makefile's own recipe lines and sizes it with
`du -sb`: the lines it reads are checked against the Makefile's text, the size against a walk of the tree."""

from __future__ import annotations

import os
from pathlib import Path

from helpers import _load_tool

bench = _load_tool("bench_env_sizes", "benchmarks")


def test_recipe_reads_the_venv_and_pip_lines_of_one_target(tmp_path):
    makefile = tmp_path / "Makefile"
    makefile.write_text("A := 1\n\n$(X): pyproject.toml\n\tpython3 -m venv $(VENV)\n\t# a comment\n"
                        "\t$(PY) -m pip install torch==2.13.0\n\t$(PY) -m pip install -e .\n\ttouch $(X)\n\n"
                        "$(Y): pyproject.toml\n\t$(PY) -m pip install -e '.[dev]'\n")
    assert bench.recipe("$(X)", makefile) == ["python3 -m venv $(VENV)", "$(PY) -m pip install torch==2.13.0",
                                              "$(PY) -m pip install -e ."]
    assert bench.recipe("$(Y)", makefile) == ["$(PY) -m pip install -e '.[dev]'"]


def test_the_two_environments_are_make_demos_and_make_installs():
    runtime, dev = bench.recipe(bench.TARGETS["runtime"]), bench.recipe(bench.TARGETS["dev"])
    for lines in (runtime, dev):
        assert lines[0] == "python3 -m venv $(VENV)" and "$(PY) -m pip install torch==2.13.0" in lines
    assert "$(PY) -m pip install -e ." in runtime and not any("[dev]" in ln for ln in runtime)
    assert "$(PY) -m pip install -e '.[dev]'" in dev
    makefile = (bench.ROOT / "Makefile").read_text()
    assert "demo: $(RUNTIME_STAMP)" in makefile  # `make demo` builds the runtime environment


def test_measure_sizes_the_venv_it_built(tmp_path, monkeypatch):
    """A recipe of a venv and one 12,345-byte package (written by the venv's own `$(PY)`), sized as built."""
    install = ("$(PY) -c \"import os, site; p = os.path.join(site.getsitepackages()[0], 'pkg'); os.makedirs(p); "
               "open(os.path.join(p, 'data.bin'), 'wb').write(b'x' * 12345)\"")
    monkeypatch.setattr(bench, "recipe", lambda target: ["python3 -m venv --without-pip $(VENV)", install])
    monkeypatch.setattr(bench, "TARGETS", {"runtime": "$(X)"})
    env = bench.measure("runtime", tmp_path)
    venv = tmp_path / "runtime"
    # du -sb: the apparent sizes of every file, directory and link, each counted once (a fresh venv has no hard links)
    walked = [os.lstat(os.path.join(d, n)).st_size for d, dirs, files in os.walk(venv) for n in dirs + files]
    assert env["bytes"] == sum(walked) + os.lstat(venv).st_size
    pkg = next((venv / "lib").glob("python*/site-packages")) / "pkg"
    assert env["largest_site_packages"] == {"pkg": 12_345 + os.lstat(pkg).st_size}
    assert env["commands"][0] == "python3 -m venv --without-pip $(VENV)" and env["make_target"] == "$(X)"


def test_the_pages_sentence_is_generated_from_the_results_file(tmp_path, monkeypatch):
    import json

    tool = _load_tool("readme_results")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    envs = {"runtime": {"bytes": 1_674_121_963, "largest_site_packages": {"torch": 755_453_409}},
            "dev": {"bytes": 1_845_319_247, "largest_site_packages": {"torch": 755_444_273}}}
    (tmp_path / "benchmarks" / "results" / "env_sizes.json").write_text(json.dumps({"environments": envs}))
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    # 1,674,121,963 B = 1.67 GB; torch 755 MB; 1,845,319,247 - 1,674,121,963 = 171,197,284 B = 171 MB
    assert tool.generated_block("bench/env-sizes") == (
        "On disk, `make demo`'s environment (the runtime) takes 1.7 GB, torch 755 MB of it; `make install`'s, with "
        "the dev extras, 171 MB more (1.8 GB; `du -sb` of each venv, `benchmarks/bench_env_sizes.py`).\n")
