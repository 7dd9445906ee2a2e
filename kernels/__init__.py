"""Triton kernels (flash_attn, gla) and their plain-PyTorch references (reference).

Nothing is imported eagerly: `import kernels.flash_attn` or `import kernels.gla` pulls in Triton,
and whether its kernels run under the interpreter is decided by TRITON_INTERPRET at that import.
kernels.reference needs only PyTorch.
"""
