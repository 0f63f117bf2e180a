"""Suite-wide test settings.

Tiny models spend more time in thread hand-offs than in arithmetic: one intra-op thread makes the
suite several times faster on a 2-core machine (and immune to whatever else runs beside it).
Tests that measure or need threading set their own.

`SINKDLM_TEST_WITHOUT=lm_eval,datasets,...` hides those packages from the test process (below).
"""

import os
import sys

# A machine without the optional extras, simulated: SINKDLM_TEST_WITHOUT=lm_eval,datasets,accelerate,pyarrow
# makes importing those fail in the test process (None in sys.modules), so their tests must skip, with
# the reason, rather than fail. Subprocesses a test starts still see the installed packages.
for _name in filter(None, (n.strip() for n in os.environ.get("SINKDLM_TEST_WITHOUT", "").split(","))):
    sys.modules[_name] = None

import torch  # noqa: E402

# SINKDLM_TEST_THREADS: the rerun guard (Makefile `test-numerics`) runs the numerics tests on 2 threads, a
# setting measured to change float32 results (tools/kernel_sensitivity.py; tests/numerics.py).
torch.set_num_threads(int(os.environ.get("SINKDLM_TEST_THREADS", "1")))


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` run where a GPU is, and are skipped (not failed) elsewhere."""
    if torch.cuda.is_available():
        return
    import pytest

    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


FUZZ_COUNTS = "fuzz_counts"  # the user property in which test_cli_fuzz.py reports each test's case counts
_fuzz_counts: dict[str, dict[str, int]] = {}


def pytest_runtest_logreport(report):
    """Sum the fuzz tests' case counts from their reports' user properties: pytest-xdist sends those from
    the workers to the controller, where the terminal summary is written (a stash would stay in a worker)."""
    if report.when != "call":
        return
    for key, value in report.user_properties:
        if key == FUZZ_COUNTS:
            for name, row in value.items():
                into = _fuzz_counts.setdefault(name, dict.fromkeys(row, 0))
                for k, v in row.items():
                    into[k] = into.get(k, 0) + v


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The CLI fuzz test's number of cases per command (test_cli_fuzz.py), for the CI log."""
    if _fuzz_counts:
        terminalreporter.write_sep("-", "CLI fuzz cases per command")
        for name, row in _fuzz_counts.items():
            outcomes = ", ".join(f"{k} {v}" for k, v in row.items() if k != "cases" and v)
            terminalreporter.write_line(f"{name:>16}: {row['cases']:3d} cases ({outcomes})")
