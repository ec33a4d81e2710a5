"""The other process of the two-process tests: an agent that registers regions and obeys
JSON-line commands on stdin, answering one JSON line each on stdout.

Started by conftest.Peer. Environment: GDX_TEST_SECRET (hex; absent = use GDX_SECRET_FILE or
nothing), GDX_TEST_TRANSPORTS (comma list). Regions it publishes:

- ``kv``   4 MiB numpy uint8 array, access "rw" (a borrowed buffer)
- ``pool`` 4 MiB agent-allocated, access "rw" (shared memory)
- ``ro``   1 MiB numpy array, access "r", filled with pattern seed 7
"""

import json
import os
import sys

import numpy as np

import gdx

MiB = 1 << 20


def pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def main():
    kw = {}
    if os.environ.get("GDX_TEST_SECRET"):
        kw["secret"] = bytes.fromhex(os.environ["GDX_TEST_SECRET"])
    if os.environ.get("GDX_TEST_TRANSPORTS"):
        kw["transports"] = os.environ["GDX_TEST_TRANSPORTS"].split(",")
    agent = gdx.Agent("target", listen="127.0.0.1:0", **kw)
    arrays = {"kv": np.zeros(4 * MiB, np.uint8), "ro": pattern(MiB, 7)}
    regions = {
        "kv": agent.register(arrays["kv"], name="kv", access="rw"),
        "ro": agent.register(arrays["ro"], name="ro", access="r"),
        "pool": agent.alloc(4 * MiB, name="pool", access="rw"),
    }

    def host_bytes(name):
        if name in arrays:
            return arrays[name]
        return np.frombuffer(regions[name].view(), dtype=np.uint8)

    print(json.dumps({"address": agent.address, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["cmd"]
        out = {"ok": True}
        try:
            if op == "dump":
                host_bytes(cmd["name"]).tofile(cmd["path"])
            elif op == "fill":
                host_bytes(cmd["name"])[:] = pattern(host_bytes(cmd["name"]).size, cmd["seed"])
            elif op == "note":
                n = agent.wait_notification(timeout=cmd.get("timeout", 10.0))
                out.update(sender=n.sender, data=n.data.hex())
            elif op == "close":
                regions[cmd["name"]].close()
            elif op == "exit":
                print(json.dumps(out), flush=True)
                return
            else:
                out = {"ok": False, "error": f"unknown command {op}"}
        except gdx.Error as e:
            out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
