"""The bridge runtime's status call: whether the model is loaded (or failed to), the KV cache and
queue, and the cloud tier's breaker and, when asked, a health check of it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from android_bridge.errors import BridgeError

if TYPE_CHECKING:
    from android_bridge.runtime import BridgeRuntime


async def runtime_status(runtime: BridgeRuntime, check_cloud: bool, timeout_s: float) -> dict:
    engine = runtime.engine
    loaded = engine is not None and engine.is_ready
    state = "ready" if loaded and (runtime.cloud is None or runtime.cloud.is_ready) else "loading"
    engines = [e for e in (engine, runtime.cloud.engine if runtime.cloud is not None else None) if e is not None]
    load_error = next((e.load_error for e in engines if e.load_error is not None), None)
    if load_error is not None:
        state = "failed"
    status = {
        "state": state,
        "model": engine.model_name if engine is not None else None,
        "model_loaded": loaded,
        "uptime_s": round(time.time() - runtime.started_at, 3),
        "requests_in_flight": runtime.num_in_flight,
    }
    if load_error is not None:
        status["error"] = BridgeError(
            "start_failed", f"the model did not load: {load_error}", 500, "server_error"
        ).as_dict()["error"]
    if loaded:
        stats = engine.stats()
        status["kv_cache"] = {
            "blocks_used": stats.num_kv_blocks_used,
            "blocks_total": stats.num_kv_blocks_total,
            "usage": round(stats.kv_usage, 4),
        }
        status["engine"] = {"running": stats.num_running, "waiting": stats.num_waiting}
    status["cloud"] = await _cloud_status(runtime, check_cloud, timeout_s)
    return status


async def _cloud_status(runtime: BridgeRuntime, check_cloud: bool, timeout_s: float) -> dict:
    if runtime.cloud is None or runtime.cloud.client is None:
        return {"configured": False, "reachable": False}
    cloud = {"configured": True, "target": runtime.cloud.description, "breaker": runtime.runner.breaker.state.value}
    if check_cloud:
        started = time.time()
        try:
            serving = await runtime.cloud.client.health(timeout_s=timeout_s)
            runtime.cloud_check = {"reachable": serving == "SERVING", "health": serving}
        except Exception as exc:  # the CloudError names the failure; the status call itself succeeds
            runtime.cloud_check = {"reachable": False, "error": str(exc)}
        runtime.cloud_check["checked_at"] = round(started, 3)
    # reachable is null until a check has run: the breaker alone cannot tell "up" from "never called"
    return {**cloud, "reachable": None, **(runtime.cloud_check or {})}
