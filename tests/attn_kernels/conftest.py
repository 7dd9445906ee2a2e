"""Kernel tests run on CUDA when present, otherwise under the Triton interpreter on CPU.

Triton decides interpreted vs compiled when a kernel is decorated, so TRITON_INTERPRET must be in
the environment before attn_kernels.flash_attn is imported: set it here, before any test module loads.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def exact_fp32_matmul():
    """The fp32 reference must not use TF32 on CUDA, whatever other code set globally."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
