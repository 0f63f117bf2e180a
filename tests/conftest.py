"""Suite-wide test settings.

Tiny models spend more time in thread hand-offs than in arithmetic: one intra-op thread makes the
suite several times faster on a 2-core machine (and immune to whatever else runs beside it).
Tests that measure or need threading set their own.
"""

import torch

torch.set_num_threads(1)
