"""Where a decode step's time goes (scripts/cuda-check.sh runs it on a GPU): wall time per engine phase,
cProfile, torch profiler.

python scripts/cuda_step_profile.py MODEL_DIR BATCH OUT.txt
"""

import cProfile, io, os, pstats, sys, time
import torch
from cloud_engine.llm import LLM
from sdk.protocol.engine import SamplingParams

model, batch, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
llm = LLM(model, kv_cache_gb=1.0, max_num_seqs=32)
eng = llm.engine
sync = (lambda: torch.cuda.synchronize()) if eng.device.type == "cuda" else (lambda: None)
# Phase timers around the engine's own step pieces.
timing, calls = {}, {}


def timed(obj, name, label):
    fn = getattr(obj, name)

    def wrapper(*a, **k):
        sync()
        t = time.perf_counter()
        r = fn(*a, **k)
        sync()
        timing[label] = timing.get(label, 0.0) + time.perf_counter() - t
        calls[label] = calls.get(label, 0) + 1
        return r

    setattr(obj, name, wrapper)


timed(eng.scheduler, "schedule", "schedule")
timed(eng.runner, "prepare", "prepare")
timed(eng.runner, "execute", "execute(forward)")
timed(eng, "_sample", "sample")
timed(eng.scheduler, "update_from_output", "update")
timed(eng, "_finish_tokens", "finish_tokens")
prompts = [[100 + i] * 64 for i in range(batch)]


def run(n_tokens):
    llm.generate(prompts, [SamplingParams(max_tokens=n_tokens, temperature=0.0, ignore_eos=True)] * batch)


run(8)  # warm-up
timing.clear()
calls.clear()
sync()
t = time.perf_counter()
run(64)
sync()
wall = time.perf_counter() - t
phases = dict(timing)  # the measured run's alone: the profiled runs below add to the wrappers' dict
steps = calls["execute(forward)"]  # counted, not assumed: how many steps the prefill takes depends on the budget
lines = [
    f"device {eng.device} dtype {eng.dtype} backend {eng.attention_backend} "
    f"threads {torch.get_num_threads()} batch {batch}",
    f"64 tokens x {batch}: {wall:.3f} s, {64 * batch / wall:.1f} tok/s, "
    f"{wall / steps * 1000:.1f} ms per step ({steps} steps)",
]
lines += [f"  {k:18s} {v * 1000 / steps:8.2f} ms/step" for k, v in sorted(phases.items(), key=lambda kv: -kv[1])]
# Profiles without the sync wrappers' distortion beyond what they add (noted).
prof = cProfile.Profile()
prof.enable()
run(32)
prof.disable()
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(35)
lines.append(s.getvalue())
acts = [torch.profiler.ProfilerActivity.CPU] + (
    [torch.profiler.ProfilerActivity.CUDA] if eng.device.type == "cuda" else []
)
calls.clear()
with torch.profiler.profile(activities=acts) as p:
    run(16)
profiled_steps = calls["execute(forward)"]
lines.append(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
if eng.device.type == "cuda":
    lines.append(p.key_averages().table(sort_by="self_cuda_time_total", row_limit=25))
open(out, "w").write("\n".join(lines))
# The figures docs/cloud-engine.md quotes, as JSON beside the text.
events = {e.key: e for e in p.key_averages()}
launches = sum(events[k].count for k in ("cudaLaunchKernel", "cudaLaunchKernelExC") if k in events)
cuda_us = sum(e.self_device_time_total for e in p.key_averages()) if eng.device.type == "cuda" else 0.0
summary = {
    "command": "python scripts/cuda_step_profile.py " + " ".join(sys.argv[1:]),
    "device": str(eng.device),
    "gpu": torch.cuda.get_device_name(0) if eng.device.type == "cuda" else None,
    "torch": torch.__version__,
    "torch_threads": torch.get_num_threads(),
    "batch": batch,
    "steps": steps,
    "step_ms": wall / steps * 1000,
    "phases_ms_per_step": {k: v * 1000 / steps for k, v in phases.items()},
    "profiled_steps": profiled_steps,
    "kernel_launches_per_step": launches / profiled_steps,
    "gpu_ms_per_step": cuda_us / 1000 / profiled_steps,
}
import json

with open(os.path.splitext(out)[0] + ".json", "w") as f:
    json.dump(summary, f, indent=2)
print("\n".join(lines[:12]))
