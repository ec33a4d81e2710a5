# torch references for gdx's engine benchmark (GPU0->GPU1 copy_, 8 MiB / 1 GiB, both directions,
# 8-byte copy + synchronize p50). One JSON object per line. GB/s = 1e9 B/s.
import json, time, torch
def emit(k, v, u): print(json.dumps({"key": k, "value": round(v, 3), "unit": u}), flush=True)
G = 1 << 30
a = torch.empty(G, dtype=torch.uint8, device="cuda:0"); b = torch.empty(G, dtype=torch.uint8, device="cuda:1")
for n, reps, key in [(8 << 20, 400, "p2p_8MiB"), (G, 10, "p2p_1GiB")]:
    s, d = a[:n], b[:n]; d.copy_(s); torch.cuda.synchronize(0); torch.cuda.synchronize(1)
    best = 1e30
    for _ in range(3):
        e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
        with torch.cuda.device(0):
            e0.record()
            for _ in range(reps): d.copy_(s, non_blocking=True)
            e1.record(); e1.synchronize()
        best = min(best, e0.elapsed_time(e1))
    emit(key, n * reps / (best / 1e3) / 1e9, "GB/s")
s0 = torch.cuda.Stream(0); s1 = torch.cuda.Stream(1); best = 1e30
for _ in range(3):
    torch.cuda.synchronize(0); torch.cuda.synchronize(1); t = time.perf_counter()
    for _ in range(10):
        with torch.cuda.stream(s0): b.copy_(a, non_blocking=True)
        with torch.cuda.stream(s1): a.copy_(b, non_blocking=True)
    s0.synchronize(); s1.synchronize(); best = min(best, time.perf_counter() - t)
emit("p2p_bidir_1GiB", 2 * G * 10 / best / 1e9, "GB/s")
x = a[:8]; y = b[:8]; v = []
for i in range(6000):
    t = time.perf_counter(); y.copy_(x); torch.cuda.synchronize(0)
    if i >= 1000: v.append((time.perf_counter() - t) * 1e6)
v.sort(); emit("p2p_8B_latency_p50", v[len(v) // 2], "us")
