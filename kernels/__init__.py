"""Triton kernels (flash_attn) and their plain-PyTorch references (reference).

Nothing is imported eagerly: `import kernels.flash_attn` pulls in Triton, and whether its kernels
run under the interpreter is decided by TRITON_INTERPRET at that import.
"""
