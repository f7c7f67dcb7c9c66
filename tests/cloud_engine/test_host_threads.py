"""The engine on CUDA drops torch's intra-op threads to one (the host only launches kernels);
on CPU, or with OMP_NUM_THREADS set by the operator, nothing changes."""

from __future__ import annotations

import pytest
import torch

from cloud_engine.host_threads import limit_host_threads_for_gpu


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_cuda_engine_uses_one_host_thread(threads):
    assert limit_host_threads_for_gpu(torch.device("cuda"), environ={})
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("device, environ", [("cpu", {}), ("cuda", {"OMP_NUM_THREADS": "4"})])
def test_cpu_engines_and_operator_choices_keep_their_threads(threads, device, environ):
    assert not limit_host_threads_for_gpu(torch.device(device), environ=environ)
    assert torch.get_num_threads() == 2
