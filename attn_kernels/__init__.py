"""Triton kernels (flash_attn, gla), where they can run (env), and their plain-PyTorch forms.

    flash_attn.py      FlashAttention-2, forward and backward; supports(...) says which cases it takes
    gla.py             chunked gated linear attention, forward and backward; supports(...) likewise
    env.py             one answer for both: interpreted(), available(device), why_unavailable(device)
    gla_chunked.py     GLA in PyTorch: the chunked form (training, prefill) and the decoding step
    reference.py       the references the kernels are tested against: softmax attention with an
                       explicit score matrix, GLA's recurrence as a loop over time

Nothing is imported eagerly: `import attn_kernels.flash_attn` or `import attn_kernels.gla` pulls in Triton,
and whether its kernels run under the interpreter is decided by TRITON_INTERPRET at that import.
attn_kernels.env, attn_kernels.reference and attn_kernels.gla_chunked need only PyTorch.
"""
