"""The engines of the vLLM end-to-end test and benchmark, one process each.

    harness.py prefill --model DIR --out F [--copies K] [--go FILE] [--connector JSON]
        A prefill engine (GdxConnector, kv_producer). Generates the prompts plainly first
        (the single-engine baseline: 16 greedy tokens each), waits for FILE (if given), then
        prefills them K times with do_remote_decode (its first token), writes F (JSON: pid,
        baseline, params per copy), and keeps serving the KV until F + ".stop" appears (or
        --linger seconds pass). vLLM's engine loop spins while blocks are held: --go lets a
        test start holding only once the decode engines are up.
    harness.py decode --model DIR --out F --requests PARAMS_FILE:COPY [...] [--wait-for FILE]
        A decode engine (GdxConnector, kv_consumer). Once up, it writes F + ".ready", waits for
        the params files (and --wait-for), then generates each request set in turn with the
        prefill's kv_transfer_params and records the outputs, vLLM's counters and times.
    harness.py bench --model DIR --params F --go FILE --out F
        TTFT of the decode engine: computing the prompt (prefill engine idle), then loading
        its KV with gdx (touches FILE, waits for the prefill's params F).

``--connector`` merges into the kv_transfer_config (e.g. a test subclass through
kv_connector_module_path, extra config, kv_load_failure_policy).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
# vLLM pins each CPU worker's OpenMP threads to the last cores; several engines on one small
# host would then all compute on the same core (a prefill holding KV spins there too). Let the
# kernel place them instead.
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("OMP_NUM_THREADS", "1")

MAX_TOKENS = 16
# Prompts of 80 to 200 tokens: several 32-token blocks each, last block partly filled.
TEXTS = [
    "The quick brown fox jumps over the lazy dog. " * 2 + "Paged attention keeps blocks.",
    "A prefill engine computes the prompt once; a decode engine loads its blocks. " * 2,
    "Numbers 0123456789 and punctuation .,;:!? make every byte appear. " * 3,
    "The cat sleeps on the warm mat while the key and value cache fills. " * 2 + "End.",
]


def engine(model: str, role: str, connector: dict, block_size: int, **kw):
    from vllm import LLM
    from vllm.config import KVTransferConfig

    cfg = {
        "kv_connector": "GdxConnector",
        "kv_connector_module_path": "gdx.vllm",
        "kv_role": role,
        **connector,
    }
    return LLM(
        model=model,
        dtype="float32",
        max_model_len=kw.pop("max_model_len", 512),
        enforce_eager=True,
        block_size=block_size,
        enable_prefix_caching=False,
        # Small: four engines share a small host's memory in the test.
        kv_cache_memory_bytes=kw.pop("kv_cache_mib", 128) << 20,
        disable_log_stats=False,
        kv_transfer_config=KVTransferConfig(**cfg),
        **kw,
    )


def sampling(max_tokens: int, params: dict | None = None):
    from vllm import SamplingParams

    extra = {"kv_transfer_params": params} if params is not None else None
    return SamplingParams(temperature=0, max_tokens=max_tokens, extra_args=extra)


def counters(llm) -> dict[str, float]:
    want = ("external_prefix_cache_hits", "external_prefix_cache_queries", "prompt_tokens")
    out = {}
    for m in llm.get_metrics():
        short = m.name.removeprefix("vllm:")
        if short in want and hasattr(m, "value"):
            out[short] = m.value
    return out


def write_json(path: str, doc: dict) -> None:
    tmp = f"{path}.tmp"
    Path(tmp).write_text(json.dumps(doc))
    os.replace(tmp, path)  # readers never see a half-written file


def wait_for(paths: list[str], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not all(Path(p).exists() for p in paths):
        if time.monotonic() > deadline:
            raise SystemExit(f"harness: {paths} did not appear within {seconds} s")
        time.sleep(0.1)


def prefill(a) -> None:
    llm = engine(a.model, "kv_producer", json.loads(a.connector), a.block_size,
                 max_model_len=a.max_model_len, kv_cache_mib=a.kv_cache_mib)
    prompts = a.texts
    base = llm.generate(prompts, sampling(MAX_TOKENS))
    if a.go:
        wait_for([a.go], a.linger)
    copies = []
    for _ in range(a.copies):
        outs = llm.generate(prompts, sampling(1, {"do_remote_decode": True}))
        copies.append([o.kv_transfer_params for o in outs])
    first = [o.outputs[0].token_ids[0] for o in outs]
    write_json(
        a.out,
        {
            "pid": os.getpid(),
            "prompts": prompts,
            "baseline": [list(o.outputs[0].token_ids) for o in base],
            "prompt_tokens": [len(o.prompt_token_ids) for o in base],
            "prefill_first_token": first,
            "params": copies,
        },
    )
    print(f"prefill: ready, {a.copies} cop(ies) of {len(prompts)} prompts held", flush=True)
    stop, deadline = Path(a.out + ".stop"), time.monotonic() + a.linger
    while not stop.exists() and time.monotonic() < deadline:
        time.sleep(0.2)


def decode(a) -> None:
    llm = engine(a.model, "kv_consumer", json.loads(a.connector), a.block_size)
    Path(a.out + ".ready").touch()
    wait_for([s.rsplit(":", 1)[0] for s in a.requests] + a.wait_for, a.linger)
    sets = []
    for spec in a.requests:
        path, copy = spec.rsplit(":", 1)
        doc = json.loads(Path(path).read_text())
        params = doc["params"][int(copy)]
        t0 = time.monotonic()
        outs = llm.generate(doc["prompts"], [sampling(MAX_TOKENS, p) for p in params])
        sets.append(
            {
                "spec": spec,
                "seconds": time.monotonic() - t0,
                "token_ids": [list(o.outputs[0].token_ids) for o in outs],
                "finish_reasons": [o.outputs[0].finish_reason for o in outs],
                "num_cached_tokens": [o.num_cached_tokens for o in outs],
                "counters": counters(llm),
            }
        )
        print(f"decode: {spec} done in {sets[-1]['seconds']:.2f} s", flush=True)
    write_json(a.out, {"sets": sets})


def bench(a) -> None:
    """TTFT of single requests: computing the prompt (first, while the prefill engine idles),
    then loading it over gdx (once the prefill holds ``--samples`` copies of its KV)."""
    import statistics

    llm = engine(a.model, "kv_consumer", json.loads(a.connector), a.block_size,
                 max_model_len=a.max_model_len, kv_cache_mib=a.kv_cache_mib)
    prompt = TEXTS[0] * a.prompt_repeat
    llm.generate([prompt], sampling(1), use_tqdm=False)  # warm-up: the first forward is slower

    def ttft(params: dict | None):
        t0 = time.perf_counter()
        out = llm.generate([prompt], sampling(1, params), use_tqdm=False)[0]
        return time.perf_counter() - t0, out

    rows = {"recompute": [ttft(None)[0] for _ in range(a.samples)], "gdx": []}
    Path(a.go).touch()  # the prefill engine may compute and hold the KV now
    wait_for([a.params], a.linger)
    doc = json.loads(Path(a.params).read_text())
    if doc["prompts"] != [prompt]:
        raise SystemExit("bench: the prefill engine's prompt is not this one")
    for copy in doc["params"]:
        rows["gdx"].append(ttft(copy[0])[0])
    res = {
        m: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v), "n": len(v)}
        for m, v in rows.items()
    }
    hits = counters(llm).get("external_prefix_cache_hits", 0)
    want = (doc["prompt_tokens"][0] - 1) * len(doc["params"])
    if hits != want:
        raise SystemExit(f"bench: {hits} prompt tokens came from the connector, expected {want}")
    res["prompt_tokens"] = doc["prompt_tokens"][0]
    res["external_prefix_cache_hits"] = hits
    res["speedup"] = res["recompute"]["median_s"] / res["gdx"]["median_s"]
    write_json(a.out, res)
    print(json.dumps(res, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("prefill", "decode", "bench"):
        s = sub.add_parser(name)
        s.add_argument("--model", required=True)
        s.add_argument("--out", required=True)
        s.add_argument("--block-size", type=int, default=32)
        s.add_argument("--connector", default="{}", help="JSON merged into kv_transfer_config")
        s.add_argument("--linger", type=float, default=600.0, help="bound on every wait, s")
        s.add_argument("--kv-cache-mib", type=int, default=128)
    pre = sub.choices["prefill"]
    pre.add_argument("--copies", type=int, default=1)
    pre.add_argument("--go", help="prefill only once this file exists")
    pre.add_argument("--prompt-repeat", type=int, default=1,
                     help="repeat each text N times (long prompts for the benchmark)")
    pre.add_argument("--prompts", type=int, default=len(TEXTS), help="the first N texts only")
    pre.add_argument("--max-model-len", type=int, default=512)
    dec = sub.choices["decode"]
    dec.add_argument("--requests", nargs="+", required=True)
    dec.add_argument("--wait-for", nargs="*", default=[])
    b = sub.choices["bench"]
    b.add_argument("--params", required=True, help="the prefill's output (waited for)")
    b.add_argument("--go", required=True, help="created when the prefill may start")
    b.add_argument("--samples", type=int, default=5)
    b.add_argument("--prompt-repeat", type=int, default=16)
    b.add_argument("--max-model-len", type=int, default=512)
    a = p.parse_args()
    if a.cmd == "prefill":
        a.texts = [t * a.prompt_repeat for t in TEXTS[: a.prompts]]
    {"prefill": prefill, "decode": decode, "bench": bench}[a.cmd](a)


if __name__ == "__main__":  # vLLM's engine core is a spawned process: the guard is required
    main()
    sys.stdout.flush()
