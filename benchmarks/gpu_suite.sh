#!/usr/bin/env bash
# Every GPU figure in one call (issue 44): whoever is lent a GPU runs this first.
#
#   benchmarks/gpu_suite.sh OUTDIR          # at most 10 minutes (the steps' limits add up to 600 s)
#
# Runs, each under its own time limit, logging to OUTDIR/gpu_suite.log:
#   1. tests/model/test_cuda.py                       (the CUDA tests: sink path, no host sync; and
#      tests/model/test_quantize.py's CUDA tests       --quantize int8 and int4-weight on the GPU)
#   2. benchmarks/bench_gpu_train.py                  (training MFU at 0.5B, eager and compiled)
#   3. benchmarks/bench_cache.py, qwen2.5-0.5b, bf16  (KV caches; compiled tokens agreeing with eager)
#   4. benchmarks/bench_gpu_decode.py                 (~1B decoding, batch 1 and 8, eager and compiled,
#                                                      tok/s and the fraction of the weight-read bound)
#   5. benchmarks/bench_block.py, qwen2.5-0.5b, bf16  (block decoding with its cache vs no cache / dual;
#                                                      a BD3-LM training step vs a whole-sequence one, per token)
#   6. sinkdlm experiment --launcher local            (a smoke run and its report as two jobs on the GPU)
# and writes OUTDIR/gpu_suite.json (the card, each step's exit status and seconds, and every results
# file). The results files are also copied into benchmarks/results/, and docs/benchmarks.md is
# regenerated from them (tools/readme_results.py), naming the card; commit both. Without a CUDA GPU
# it says so and does nothing (exit 0). PYTHON overrides the interpreter (default .venv/bin/python).
#
# Then, in a second call if the loan has 3 minutes left (the suite's limits already fill one 10-minute call):
#   .venv/bin/python benchmarks/bench_gpu_trainable.py     # one step of a random LLaDA-8B layout, lora and sink
# which writes benchmarks/results/gpu_trainable.json (peak memory, tokens/s, the memory formula checked); commit it.
set -uo pipefail

OUT=${1:?usage: benchmarks/gpu_suite.sh OUTDIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_suite.sh: skipped, no CUDA GPU here (torch.cuda.is_available() is False); nothing was run or written"
    exit 0
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/gpu_suite.log"
STEPS="$OUT/steps.tsv"
: > "$LOG"
: > "$STEPS"
cd "$ROOT" || exit 1
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"

step() {  # step NAME LIMIT_S COMMAND...: run it under a time limit, log it, record status and seconds
    local name=$1 limit=$2
    shift 2
    echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*" | tee -a "$LOG"
    local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$STEPS"
    echo "=== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"
}

"$PY" -c "import torch; print('card:', torch.cuda.get_device_name(0), '| torch', torch.__version__)" | tee -a "$LOG"
step test_cuda 100 "$PY" -m pytest -q -p no:randomly -n 0 tests/model/test_cuda.py tests/model/test_quantize.py \
    -k "not test_quantize or cuda"  # and --quantize on CUDA: int8 within its step bound, int4-weight (tinygemm)
step bench_gpu_train 110 "$PY" benchmarks/bench_gpu_train.py --out "$OUT/bench_gpu_train.json"
step bench_cache 150 "$PY" benchmarks/bench_cache.py --device cuda --preset qwen2.5-0.5b --dtype bfloat16 \
    --out "$OUT/bench_cache_gpu.json"
step bench_gpu_decode 130 "$PY" benchmarks/bench_gpu_decode.py --out "$OUT/bench_gpu_decode.json"
# writes its JSON after each part: a run cut by the limit keeps its decoding table
step bench_block 50 "$PY" benchmarks/bench_block.py --device cuda --preset qwen2.5-0.5b --dtype bfloat16 --repeats 2 \
    --prompt 448 --seq-len 512 --batch 4 --out "$OUT/bench_block_gpu.json"
# the local launcher on the GPU: one smoke run as a job on cuda:0, then the report job (experiment/launch.py)
step launcher_local 60 "$PY" -m sinkdlm experiment --preset smoke --variants vanilla --seeds 0 \
    --out "$OUT/launcher_smoke" --launcher local --gpus-per-run 1 --device cuda

"$PY" - "$OUT" <<'EOF' 2>&1 | tee -a "$LOG"
import json, shutil, subprocess, sys
from pathlib import Path

import torch

out = Path(sys.argv[1])
results = Path("benchmarks/results")
steps = [dict(zip(("name", "exit", "seconds"), line.split("\t"))) for line in (out / "steps.tsv").read_text().splitlines()]
suite = {"card": torch.cuda.get_device_name(0), "torch": torch.__version__,
         "steps": [{**s, "exit": int(s["exit"]), "seconds": int(s["seconds"])} for s in steps], "results": {}}
for name in ("bench_gpu_train.json", "bench_cache_gpu.json", "bench_gpu_decode.json", "bench_block_gpu.json"):
    if (out / name).is_file():
        suite["results"][name] = json.loads((out / name).read_text())
        shutil.copyfile(out / name, results / name)  # what docs/benchmarks.md is generated from
(out / "gpu_suite.json").write_text(json.dumps(suite, indent=2) + "\n")
print(f"wrote {out / 'gpu_suite.json'}; copied {sorted(suite['results'])} into {results}/")
subprocess.run([sys.executable, "tools/readme_results.py"], check=False)
EOF
