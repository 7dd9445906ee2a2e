"""Triton kernels (flash_attn, gla), where they can run (env), and their plain-PyTorch forms.

    flash_attn.py      FlashAttention-2, forward and backward; supports(...) says which cases it takes
    gla.py             chunked gated linear attention, forward and backward; supports(...) likewise
    env.py             one answer for both: interpreted(), available(device), why_unavailable(device)
    gla_reference.py   GLA in PyTorch: the loop reference, the chunked form, the decoding step
    reference.py       the references the kernels are tested against (softmax attention; GLA's loop)

Nothing is imported eagerly: `import kernels.flash_attn` or `import kernels.gla` pulls in Triton,
and whether its kernels run under the interpreter is decided by TRITON_INTERPRET at that import.
kernels.env, kernels.reference and kernels.gla_reference need only PyTorch.
"""
