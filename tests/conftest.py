"""Suite-wide test settings.

Tiny models spend more time in thread hand-offs than in arithmetic: one intra-op thread makes the
suite several times faster on a 2-core machine (and immune to whatever else runs beside it).
Tests that measure or need threading set their own.
"""

import torch

torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` run where a GPU is, and are skipped (not failed) elsewhere."""
    if torch.cuda.is_available():
        return
    import pytest

    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
