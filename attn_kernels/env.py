"""Where the Triton kernels can run in this process: one answer for attn_kernels/flash_attn.py and attn_kernels/gla.py.

    interpreted()            whether Triton kernels run under its interpreter (TRITON_INTERPRET)
    why_unavailable(device)  None when the kernels can take tensors of `device`, else the reason
    available(device)        why_unavailable(device) is None

Needs only PyTorch to import: Triton is imported on the first question, and a missing Triton
is an answer (not available), not an error.
"""
import functools

import torch


@functools.cache
def _triton_installed() -> bool:
    try:
        import triton  # noqa: F401
        return True
    except ImportError:
        return False


@functools.cache
def interpreted() -> bool:
    """True when Triton kernels run under the interpreter (on CPU tensors). Triton decides this
    when a kernel is decorated, from TRITON_INTERPRET; a probe decorated the same way gives its
    own answer. Asked once per process: the kernel modules ask at import, just before decorating
    their kernels, so the answer is theirs."""
    if not _triton_installed():
        return False
    import triton

    @triton.jit
    def _probe():
        pass
    return type(_probe).__name__ == "InterpretedFunction"


def why_unavailable(device) -> str | None:
    """None when the kernels run on tensors of `device` here (compiled on CUDA, interpreted on
    CPU); otherwise one line saying why and what would change it."""
    device = torch.device(device)
    if not _triton_installed():
        return "Triton is not installed (pip install triton)"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available"
        if interpreted():
            return "TRITON_INTERPRET=1 makes the kernels run interpreted, on CPU tensors only; unset it"
        return None
    if device.type == "cpu":
        if interpreted():
            return None
        return "off CUDA the kernels run only under Triton's interpreter: set TRITON_INTERPRET=1 (slow, for tests)"
    return f"the kernels run on CUDA (or CPU under the interpreter), not on {device.type}"


def available(device) -> bool:
    """Whether the Triton kernels can run on tensors of `device` in this process."""
    return why_unavailable(device) is None
