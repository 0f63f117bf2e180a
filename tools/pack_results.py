"""Developer tooling: move a committed study's bulky per-run arrays into one compact file per study.

Each run's fixed-validation values (`val.json`) and escape probes (`escape/probes.json`) go into the study's
`per_run.npz`, exact (float64); the JSON files keep every other field and name the pack
(`sinkdlm.experiment.packed`, which the report code reads them through). Run it on a finished study before it is
committed (CONTRIBUTING.md, "What a study commits"); nothing else changes, and a second run packs only what is new.

    .venv/bin/python tools/pack_results.py docs/results/NAME [...]
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from sinkdlm.experiment.packed import pack_study

    if not argv:
        print(__doc__.strip().splitlines()[-1].strip())
        return 2
    for study in map(Path, argv):
        if not study.is_dir():
            print(f"error: {study} is not a directory: give a study's folder (docs/results/NAME)", file=sys.stderr)
            return 2
        packed, before, after = pack_study(study)
        print(f"{study}: {packed} file(s) packed, {before / 1e6:.2f} MB -> {after / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
