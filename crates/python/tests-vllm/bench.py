"""TTFT of a decode engine: loading the prompt's KV over gdx vs computing the prefill itself.

    python bench.py [--repeat 16] [--samples 5] [--model-config models/bench.json]

Builds the benchmark model (8 layers, hidden 512, random weights) and starts a prefill engine
and a decode engine. The decode engine times ``generate(max_tokens=1)`` of one long prompt
``--samples`` times computing it (the prefill engine idle meanwhile), then lets the prefill
engine compute the prompt ``--samples`` times and hold each copy's KV, and times the same
request with each copy's ``kv_transfer_params`` (gdx loads all prompt tokens but the last).
While it holds KV, vLLM's prefill loop spins on this host's cores: that costs the gdx samples,
never the recompute ones. Prints and writes (``--out``) medians, min/max and the ratio. Run it through
``scripts/test-vllm.sh --bench`` (installs vLLM's CPU build and gdx's wheel first).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engines import HERE, Engine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-config", default=str(HERE / "models" / "bench.json"))
    p.add_argument("--repeat", type=int, default=16, help="prompt = the first text x N")
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--out", default="-")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gdx-vllm-bench-"))
    model = work / "model"
    subprocess.run([sys.executable, str(HERE / "make_model.py"), a.model_config, str(model)],
                   check=True, capture_output=True)
    secret = work / "secret"
    secret.write_text(os.urandom(32).hex())
    conn = json.dumps({"kv_connector_extra_config": {"secret_file": str(secret)}})
    common = ["--model", str(model), "--max-model-len", "4096", "--kv-cache-mib", "1024",
              "--connector", conn]
    deadline = time.monotonic() + 1200
    go = work / "go"
    pre = Engine(work, "prefill", ["prefill", *common, "--copies", str(a.samples), "--go",
                                   str(go), "--prompt-repeat", str(a.repeat), "--prompts", "1"])
    b = Engine(work, "bench", ["bench", *common, "--params", str(pre.out), "--go", str(go),
                               "--samples", str(a.samples), "--prompt-repeat", str(a.repeat)])
    try:
        res = b.finish(deadline)
    finally:
        b.stop()
        pre.stop()
    res["model"] = Path(a.model_config).name
    text = json.dumps(res, indent=1)
    print(text)
    if a.out != "-":
        Path(a.out).write_text(text)
    print(f"bench: logs in {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
