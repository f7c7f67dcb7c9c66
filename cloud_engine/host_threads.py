"""On a GPU, the host's CPU only launches kernels: one intra-op thread, not one per core.

Measured on an H200 machine (16 cores, SmolLM2-135M's shape, 16 decoding requests): a decode
step took 41.6 ms with torch's default of 16 intra-op threads and 21.0 ms with one, while the
GPU's own work was ~3.5 ms a step. The step is bound by the host launching ~1,400 small kernels,
and idle OpenMP workers compete with the one thread that launches them. vLLM's GPU workers
make the same choice (torch parallelism reduced to 1 unless OMP_NUM_THREADS says otherwise).
An explicit OMP_NUM_THREADS is the operator's choice and is kept.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import torch

logger = logging.getLogger("tandem.cloud")


def limit_host_threads_for_gpu(device: torch.device, environ: Mapping[str, str] = os.environ) -> bool:
    """One intra-op thread when the engine runs on CUDA and OMP_NUM_THREADS is unset; True if changed."""
    if device.type != "cuda" or "OMP_NUM_THREADS" in environ or torch.get_num_threads() == 1:
        return False
    logger.info(
        "cloud engine on %s: torch intra-op threads %d -> 1 (set OMP_NUM_THREADS to choose)",
        device,
        torch.get_num_threads(),
    )
    torch.set_num_threads(1)
    return True
