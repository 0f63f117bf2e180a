"""`sinkdlm serve` under load (issue 67): throughput and latency at 1, 4 and 16 concurrent clients, batched against
one request at a time, in one process.

For each model (`tiny`: the tiny preset + 1 sink, random weights; `smollm2`: the example SmolLM2-135M GGUF
converted to a DLM with one sink, cached under benchmarks/.cache/serve) two servers run in this process on
ephemeral ports, alternately: `batched` (`--max-batch-size 16 --batch-window-ms 10`) and `one at a time`
(`--max-batch-size 1`). Each client thread sends completions one after another through the `openai` client
(prompts of 4 to 24 words, `max_tokens` = steps = GEN, temperature 0.8, each request its own seed), for
ROUNDS requests per client (SmolLM2: `--smollm2-gen` tokens, `--smollm2-clients`). Per setting: generated tokens per second of wall time, and p50/p95 of the
requests' latencies; the ratios batched / one at a time are of the same run. Every batched answer is also
checked against the same request's answer from the one-at-a-time server (a request's tokens must not
depend on its batch-mates): the count of differing answers is recorded.

    .venv/bin/python benchmarks/bench_serve.py [--models tiny smollm2] [--gen 32] [--rounds 2] [--device cpu]

Writes benchmarks/results/bench_serve.json (docs/benchmarks.md's table: `make readme-results`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from sinkdlm import DiffusionLM, ModelConfig
from sinkdlm.config.commands import ServeConfig
from sinkdlm.io.atomic import atomic_write_json
from sinkdlm.io.machine import cpu_name
from sinkdlm.serving.server import bind, build_server

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "bench_serve.json"
CACHE = ROOT / "benchmarks" / ".cache" / "serve"
WORDS = "to be or not to be that is the question whether tis nobler in the mind to suffer the slings and arrows".split()


def load(name: str, device: str):
    """(model, tokenizer, description) of a benchmark model."""
    from sinkdlm.checkpoint.manager import load_model_and_tokenizer

    if name == "smollm2":
        from sinkdlm.checkpoint.example_model import fetch_example_model

        target = CACHE / "smollm2-dlm"
        if not (target / "config.json").is_file():
            subprocess.run([sys.executable, "-m", "sinkdlm", "convert", "--from-hf", str(fetch_example_model()),
                            "--out", str(target), "--num-sink-tokens", "1"], check=True)
        model, tok = load_model_and_tokenizer(target, device=device)
        return model, tok, "SmolLM2-135M converted to a DLM + 1 sink (float32)"
    model, tok = load_model_and_tokenizer(_tiny_dir(), device=device)
    return model, tok, "tiny preset + 1 sink, random weights (float32)"


def _tiny_dir() -> Path:
    """The tiny preset + 1 sink with random weights and a 2,048-entry BPE tokenizer trained on Shakespeare."""
    from sinkdlm.data import load_documents, train_bpe_tokenizer

    target = CACHE / "tiny"
    if not (target / "config.json").is_file():
        tok = train_bpe_tokenizer([d[:200_000] for d in load_documents("shakespeare", "train")[:4]], 2048)
        torch.manual_seed(0)
        cfg = ModelConfig.from_preset("tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id, num_sink_tokens=1)
        DiffusionLM(cfg).save_pretrained(target, tokenizer=tok)
    return target


class Server:
    def __init__(self, model, tok, **settings):
        import openai

        self.sock = bind("127.0.0.1", 0)
        self.server = build_server(model, tok, ServeConfig(model_name="m", max_tokens=4096, **settings), None, "m")
        self.thread = threading.Thread(target=self.server.run, kwargs=dict(sockets=[self.sock]), daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        port = self.sock.getsockname()[1]
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=3600)

    def stop(self):
        self.server.should_exit = True
        self.thread.join()
        self.sock.close()


def _prompt(i: int) -> str:
    n = 4 + (i * 7) % 21  # 4 to 24 words
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n))


def load_run(server: Server, clients: int, rounds: int, gen: int) -> dict:
    """`clients` threads, each sending `rounds` requests one after another: tokens/s, latencies, the texts."""
    latencies, texts = [], {}

    def client(c: int):
        for r in range(rounds):
            i = c * rounds + r
            t0 = time.perf_counter()
            out = server.client.completions.create(model="m", prompt=_prompt(i), max_tokens=gen, temperature=0.8,
                                                   seed=1000 + i, extra_body=dict(steps=gen))
            latencies.append(time.perf_counter() - t0)
            texts[i] = out.choices[0].text

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    wall = time.perf_counter() - start
    q = statistics.quantiles(latencies, n=20, method="inclusive") if len(latencies) > 1 else latencies * 19
    return {"tokens_per_s": clients * rounds * gen / wall, "p50_s": statistics.median(latencies), "p95_s": q[18],
            "wall_s": wall, "requests": clients * rounds, "texts": texts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "smollm2"])
    ap.add_argument("--clients", nargs="+", type=int, default=[1, 4, 16])
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--smollm2-clients", nargs="+", type=int, default=[1, 4],
                    help="SmolLM2's client counts (a 135M DLM takes seconds a step on a busy CPU)")
    ap.add_argument("--smollm2-gen", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = {"setup": {"rounds": args.rounds,
                         "threads": args.threads, "device": args.device,
                         "machine": torch.cuda.get_device_name() if args.device.startswith("cuda") else cpu_name(),
                         "load_at_start": os.getloadavg()[0], "cores": os.cpu_count()}, "models": {}}
    for name in args.models:
        gen, client_counts = (args.smollm2_gen, args.smollm2_clients) if name == "smollm2" else (args.gen, args.clients)
        model, tok, description = load(name, args.device)
        servers = {"batched": Server(model, tok, max_batch_size=16, batch_window_ms=10),
                   "one at a time": Server(model, tok, max_batch_size=1, batch_window_ms=0)}
        rows = {}
        try:
            for clients in client_counts:
                runs = {}
                for mode in ("one at a time", "batched"):
                    runs[mode] = load_run(servers[mode], clients, args.rounds, gen)
                    print(f"{name} {clients:>2} clients {mode:>13}: {runs[mode]['tokens_per_s']:7.1f} tok/s, "
                          f"p50 {runs[mode]['p50_s']:.2f} s, p95 {runs[mode]['p95_s']:.2f} s", flush=True)
                a, b = runs["batched"], runs["one at a time"]
                differing = sum(a["texts"][i] != b["texts"][i] for i in a["texts"])
                rows[clients] = {**{m: {k: v for k, v in r.items() if k != "texts"} for m, r in runs.items()},
                                 "throughput_ratio": a["tokens_per_s"] / b["tokens_per_s"],
                                 "p50_ratio": a["p50_s"] / b["p50_s"], "answers_differing": differing}
        finally:
            for s in servers.values():
                s.stop()
        results["models"][name] = {"description": description, "gen": gen, "by_clients": rows}
        del model
        results["setup"]["load_at_end"] = os.getloadavg()[0]
        atomic_write_json(args.out, results)  # after each model: a long run keeps what it measured
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
