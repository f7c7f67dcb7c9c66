"""`prefill_weights = auto` decides by measuring (local_runtime.prefill_choice), and the copies' cache.

The rule over a measurement, the memory bound read from cgroups, the cache's pruning by bytes, and
a real measurement on the embedded model: made once per model, machine and thread count, then read back.
"""

from __future__ import annotations

import os

import pytest

from local_runtime import prefill_choice
from local_runtime.prefill_choice import MARGIN, MEMORY_SHARE, PrefillMeasurement, decide, measurement
from local_runtime.prefill_weights import cached_copy, memory_limit_bytes, prune_cache
from sdk.engine_common.model_files import default_model_path

MIB = 1 << 20


def measured(own: float, bf16: float, f16: float, copy_bytes: int = 100 * MIB, kv_bytes_per_cell: int = 1024):
    return PrefillMeasurement(
        {"own": own, "bf16": bf16, "f16": f16},
        {"bf16": copy_bytes, "f16": copy_bytes},
        kv_bytes_per_cell,
        128,
        3,
        2,
        "2026-11-28T00:00:00+00:00",
    )


@pytest.mark.parametrize(
    "times, expected",
    [
        ((400, 180, 230), "bf16"),  # an AVX512-BF16 CPU
        ((450, 310, 230), "f16"),  # an AVX2 CPU: F16 through sgemm
        ((300, 290, 280), None),  # a model type llama.cpp already has a GEMM for: no copy wins by the margin
        ((100, 100 * MARGIN, 200), "bf16"),  # exactly at the margin counts
    ],
)
def test_auto_takes_the_faster_copy_only_when_it_wins_by_the_margin(times, expected):
    choice = decide(measured(*times), n_cells=1024, memory_limit=64 << 30)
    assert choice.kind == expected
    assert f"{times[0]:.0f} ms" in choice.reason  # says what it measured


def test_auto_counts_the_copy_and_its_kv_pool_against_an_eighth_of_the_memory_limit():
    m = measured(400, 180, 230, copy_bytes=100 * MIB, kv_bytes_per_cell=1 * MIB)
    cost = 100 * MIB + 28 * MIB  # the copy and 28 cells of 1 MiB
    assert decide(m, n_cells=28, memory_limit=cost * MEMORY_SHARE).kind == "bf16"
    refused = decide(m, n_cells=29, memory_limit=cost * MEMORY_SHARE)  # one cell more: the pool tips it over
    assert refused.kind is None and "129 MiB" in refused.reason and f"1/{MEMORY_SHARE}" in refused.reason
    assert decide(m, n_cells=10**6, memory_limit=None).kind == "bf16"  # no limit read: only the time decides


def test_the_memory_limit_is_the_lowest_of_physical_memory_and_the_cgroups(tmp_path):
    root = tmp_path / "cgroup"
    (root / "app" / "worker").mkdir(parents=True)
    (root / "memory.max").write_text("max\n")
    (root / "app" / "memory.max").write_text(f"{512 * MIB}\n")
    (root / "app" / "worker" / "memory.max").write_text("max\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text("0::/app/worker\n")
    assert memory_limit_bytes(str(proc), str(root)) == 512 * MIB  # a parent's limit binds the child
    v1 = tmp_path / "v1"
    (v1 / "memory" / "box").mkdir(parents=True)
    (v1 / "memory" / "box" / "memory.limit_in_bytes").write_text(f"{256 * MIB}\n")
    proc.write_text("12:cpu,cpuacct:/box\n7:memory:/box\n")
    assert memory_limit_bytes(str(proc), str(v1)) == 256 * MIB
    proc.write_text("0::/\n")
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert memory_limit_bytes(str(proc), str(tmp_path / "none")) == physical  # no limit: physical memory


def test_the_cache_keeps_the_most_recently_used_copies_within_its_bytes(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_PREFILL_WEIGHTS_DIR", str(tmp_path))
    for i, name in enumerate(["old.f16.gguf", "mid.bf16.gguf", "new.f16.gguf"]):
        (tmp_path / name).write_bytes(b"x" * 100)
        os.utime(tmp_path / name, (1000 + i, 1000 + i))
    (tmp_path / "model.abc.prefill-timing.json").write_text("{}")
    (tmp_path / "crashed.gguf.partial").write_bytes(b"x")
    os.utime(tmp_path / "crashed.gguf.partial", (1000, 1000))
    prune_cache(max_bytes=250)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "mid.bf16.gguf",
        "model.abc.prefill-timing.json",
        "new.f16.gguf",
    ]
    prune_cache(keep=tmp_path / "mid.bf16.gguf", max_bytes=50)  # the one in use stays whatever its age
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mid.bf16.gguf", "model.abc.prefill-timing.json"]


@pytest.mark.slow
def test_a_measurement_is_made_once_per_model_machine_and_threads(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_PREFILL_WEIGHTS_DIR", str(tmp_path))
    model = default_model_path()
    first = measurement(model, 2)
    assert set(first.timings_ms) == {"own", "bf16", "f16"} and all(t > 0 for t in first.timings_ms.values())
    assert first.kv_bytes_per_cell > 1000 and first.copy_bytes["bf16"] > 2 * os.path.getsize(model)
    kept = [kind for kind in ("bf16", "f16") if cached_copy(model, kind).exists()]
    winner = first.fastest_copy if first.timings_ms[first.fastest_copy] <= MARGIN * first.timings_ms["own"] else None
    assert kept == ([winner] if winner else [])  # a copy that cannot be taken is not kept
    monkeypatch.setattr(prefill_choice, "measure", lambda *args: pytest.fail("measured again"))
    assert measurement(model, 2) == first  # read back
    with pytest.raises(pytest.fail.Exception):
        measurement(model, 1)  # another thread count times otherwise: its own measurement
