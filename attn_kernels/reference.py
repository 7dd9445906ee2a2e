"""Plain-PyTorch fp32 references that the Triton kernels are tested against.

Written independently of the kernels, as the math reads:
    attention_reference   explicit score matrix, additive bias, boolean mask, softmax: O(T^2)
                          memory (attn_kernels.flash_attn)
    naive_recurrent_gla   gated linear attention's recurrence, one token at a time: a Python loop
                          over T (attn_kernels.gla, attn_kernels.gla_chunked; attn_impl=naive); also
                          named gla_reference
    naive_recurrent_delta_rule  the delta rule's (and Gated DeltaNet's) recurrence, one token at a
                          time (attn_kernels.delta_chunked; attn_impl=naive)
Slow, meant for tests and small checks only. No Triton needed to import this module.
"""
import math

import torch

from attn_kernels.gla_chunked import in_fp32


def attention_reference(q, k, v, causal=True, softmax_scale=None, alibi_slopes=None, block_layout=None,
                        return_lse=False, *, block_size=64, window=None, forget=None):
    """Reference for attn_kernels.flash_attn.flash_attention, same conventions.

    q (B, H, Tq, Dqk), k (B, Hkv, Tk, Dqk), v (B, Hkv, Tk, Dv), H a multiple of Hkv.
    - causal: bottom-right aligned, query i sees key j iff j <= i + Tk - Tq.
    - alibi_slopes (H,): bias = slope[h] * (j - (i + Tk - Tq)) for all pairs.
    - block_layout (nq, nk) or (H, nq, nk) at granularity block_size tokens (cropped to the
      sequence lengths): key j is visible to query i only if layout[.., i // bs, j // bs].
    - window W: query i sees key j only if j > i + Tk - Tq - W (its last W positions).
    - forget (c_q (B, H, Tq), c_k (B, H, Tk)): FoX's bias c_q[i] - c_k[j], differentiable.
    - A query row with no visible key gets output 0 (and lse = -inf).
    Computes in fp32 and returns o in q's dtype; lse (B, H, Tq) fp32 when return_lse.
    Differentiable in q, k, v.
    """
    B, H, Tq, Dqk = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(Dqk)
    qf, kf, vf = q.float(), k.float(), v.float()
    if Hkv != H:  # GQA/MQA: query head h reads KV head h // (H // Hkv)
        kf = kf.repeat_interleave(H // Hkv, dim=1)
        vf = vf.repeat_interleave(H // Hkv, dim=1)
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale  # (B, H, Tq, Tk)

    i_abs = torch.arange(Tq, device=q.device)[:, None] + (Tk - Tq)  # query positions, bottom-right
    j = torch.arange(Tk, device=q.device)[None, :]
    if alibi_slopes is not None:
        rel = (j - i_abs).float()  # (Tq, Tk)
        scores = scores + alibi_slopes.float().to(q.device).view(1, H, 1, 1) * rel
    if forget is not None:
        c_q, c_k = (c.float() for c in forget)
        scores = scores + c_q[..., :, None] - c_k[..., None, :]

    visible = torch.ones(1, 1, Tq, Tk, dtype=torch.bool, device=q.device)
    if causal:
        visible = visible & (j <= i_abs)
    if window is not None:
        visible = visible & (j > i_abs - window)
    if block_layout is not None:
        lay = block_layout.to(device=q.device, dtype=torch.bool)
        lay = lay if lay.dim() == 3 else lay[None]
        tok = lay.repeat_interleave(block_size, dim=1).repeat_interleave(block_size, dim=2)
        visible = visible & tok[:, :Tq, :Tk][None]
    scores = scores.masked_fill(~visible, float("-inf"))

    lse = torch.logsumexp(scores, dim=-1)  # -inf where the row sees nothing
    has_key = visible.any(dim=-1, keepdim=True)  # (1 or B, 1 or H, Tq, 1)
    probs = torch.softmax(scores.masked_fill(~has_key, 0.0), dim=-1) * has_key
    o = torch.matmul(probs, vf).to(q.dtype)
    return (o, lse) if return_lse else o


@in_fp32
def naive_recurrent_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    """The reference for attn_kernels.gla.chunk_gla and attn_kernels.gla_chunked.chunk_gla: the recurrence as
    written, one token at a time, in fp32 (autocast off, so mixed precision cannot push the state into bf16),

        S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t          o_t = scale * q_t S_t

    q (B, H, T, Dk); k, g (B, Hkv, T, Dk); v (B, Hkv, T, Dv); H % Hkv == 0, query head h reading
    KV head h // (H/Hkv); g None = no decay; scale None = Dk ** -0.5; initial_state (B, Hkv, Dk, Dv)
    or None. Returns o (B, H, T, Dv) in q's dtype and the final state (fp32) or None.
    Differentiable by autograd in q, k, v, g and initial_state.
    """
    B, H, T, Dk = q.shape
    Hkv, Dv = k.size(1), v.size(-1)
    scale = Dk ** -0.5 if scale is None else scale
    qg = (q.float() * scale).view(B, Hkv, H // Hkv, T, Dk)  # the G query heads of each KV head
    k, v = k.float(), v.float()
    S = q.new_zeros(B, Hkv, Dk, Dv, dtype=torch.float32) if initial_state is None else initial_state.float()
    outs = []
    for t in range(T):
        if g is not None:
            S = g[:, :, t].float().exp()[..., None] * S
        S = S + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append(torch.einsum("bhgd,bhde->bhge", qg[:, :, :, t], S))
    o = torch.stack(outs, dim=3).reshape(B, H, T, Dv).to(q.dtype)
    return o, (S if output_final_state else None)


gla_reference = naive_recurrent_gla  # the name the kernel tests use


@in_fp32
def naive_recurrent_delta_rule(q, k, v, beta, g=None, scale=None, initial_state=None, output_final_state=False):
    """The reference for attn_kernels.delta_chunked: the recurrence as written, one token at a time, in fp32,

        S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T        o_t = scale * q_t S_t

    q, k (B, H, T, Dk); v (B, H, T, Dv); beta, g (B, H, T) (g None: no decay, DeltaNet); scale None =
    Dk ** -0.5; initial_state (B, H, Dk, Dv) or None. Returns o (B, H, T, Dv) in q's dtype and the
    final state (fp32) or None. Differentiable by autograd in every input.
    """
    B, H, T, Dk = q.shape
    scale = Dk ** -0.5 if scale is None else scale
    dtype = q.dtype
    q, k, v, beta = q.float() * scale, k.float(), v.float(), beta.float()
    S = q.new_zeros(B, H, Dk, v.size(-1)) if initial_state is None else initial_state.float()
    eye = torch.eye(Dk, device=q.device)
    outs = []
    for t in range(T):
        k_t = k[:, :, t]                                                    # (B, H, Dk)
        erase = eye - beta[:, :, t, None, None] * k_t[..., :, None] * k_t[..., None, :]   # I - beta k k^T
        decay = 1.0 if g is None else g[:, :, t].float().exp()[..., None, None]
        S = decay * (erase @ S) + beta[:, :, t, None, None] * k_t[..., :, None] * v[:, :, t, None, :]
        outs.append(torch.einsum("bhd,bhde->bhe", q[:, :, t], S))
    o = torch.stack(outs, dim=2).to(dtype)
    return o, (S if output_final_state else None)
