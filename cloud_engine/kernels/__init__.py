"""Optional native kernels behind the portable PyTorch paths in cloud_engine.attention.

`cpu_kernels()` compiles them once per machine (torch's C++ extension builder, ~30 s,
cached under the user's cache directory) and returns None, with the reason logged, when
no compiler is available; callers then keep the portable path.
"""

from cloud_engine.kernels.cpu_build import BACKENDS, cpu_kernels, kernel_cache_dir, select_decode_kernel

__all__ = ["BACKENDS", "cpu_kernels", "kernel_cache_dir", "select_decode_kernel"]
