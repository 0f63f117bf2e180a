#!/usr/bin/env bash
# Run (or resume) a declared study on the code it was settled at, whatever main holds now (docs/method.md §11).
#
#   tools/study_pinned.sh COMMIT PRESET OUT [SEEDS]
#   tools/study_pinned.sh 8503576 escape docs/results/escape 100,101,102,103,104,105,106,107,108,109,119 &
#   tools/study_pinned.sh 8503576 escape docs/results/escape 110,111,112,113,114,115,116,117,118 &
#
# A git worktree of COMMIT (../wt/study-<PRESET>-<COMMIT>, made once) supplies the code; this checkout's .venv
# runs it with that worktree's src/ first on the path, on one intra-op thread (every run of a study computes
# with the same kernels; tools/kernel_sensitivity.py). OUT is resolved here, so results land in this checkout.
# SEEDS: a shard (comma-separated); shards of one study on one OUT run side by side, one per core, and a last
# call without SEEDS, once every shard is done, writes the report over all of them.
set -euo pipefail
COMMIT=${1:?usage: tools/study_pinned.sh COMMIT PRESET OUT [SEEDS]}
PRESET=${2:?usage: tools/study_pinned.sh COMMIT PRESET OUT [SEEDS]}
OUT=${3:?usage: tools/study_pinned.sh COMMIT PRESET OUT [SEEDS]}
SEEDS=${4:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
TREE=$(dirname "$ROOT")/wt/study-$PRESET-$COMMIT
# shards started together make it once: the first holds the repository's lock, the others then find it made
if [ ! -d "$TREE/src/sinkdlm" ]; then
    (
        flock 9
        [ -d "$TREE/src/sinkdlm" ] || git -C "$ROOT" worktree add --detach "$TREE" "$COMMIT"
    ) 9<"$(git -C "$ROOT" rev-parse --path-format=absolute --git-common-dir)"
fi
mkdir -p "$(dirname "$OUT")"
OUT=$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")
cd "$TREE"
OMP_NUM_THREADS=1 PYTHONPATH="$TREE/src" exec "$PY" -m sinkdlm experiment --preset "$PRESET" --out "$OUT" \
    ${SEEDS:+--seeds "$SEEDS"}
