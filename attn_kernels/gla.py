"""Chunked gated linear attention (GLA, Yang et al. 2023) in Triton, forward and backward.

    o, final_state = chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                               chunk_size=64)

q (B, H, T, Dk); k, g (B, Hkv, T, Dk); v (B, Hkv, T, Dv); H % Hkv == 0 (query head h reads KV
head h // (H/Hkv), without copying k, v or g); g None = no decay (plain linear attention);
state (B, Hkv, Dk, Dv) fp32. The recurrence, per KV head, with g <= 0 the log-decay:

    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t          o_t = scale * q_t S_t

Inputs fp16, bf16 or fp32 (each may differ); everything is computed in fp32 (dots in IEEE fp32
when q, k, v are fp32, in TF32 otherwise). o comes back in q's dtype, the final state in fp32.

Algorithm (flash-linear-attention's chunked form, written anew). Time is cut into chunks of C
tokens (the ragged tail is masked); b_i = g_0 + ... + g_i is the log-decay from the chunk's
start (b <= 0, non-increasing), S_n the state entering chunk n.
  forward   1. cumsum:   b per chunk, stored fp32 (B, Hkv, T, Dk) (kept for the backward, not g)
            2. state:    one program per (Dk block, Dv block, batch*KV head) walks the chunks in
                         order, storing S_n (B, Hkv, N, Dk, Dv) fp32 and updating
                         S_{n+1} = exp(b_last) S_n + (k * exp(b_last - b))^T v
            3. output:   one program per 16 query rows (a sub-chunk), query head and Dv block,
                         looping over Dk blocks:
                         o = (q * exp(b)) S_n                              (earlier chunks)
                           + sum over earlier sub-chunks t of the chunk:   (this chunk)
                             ((q * exp(b - r)) (k_t * exp(r - b_t))^T) v_t, r = b at the first row
                           + the 16x16 diagonal block, pairwise: exp(b_i - b_j) with the exponent
                             set to -inf above the diagonal before exp (compiled: column by
                             column; interpreted: all pairs as one [16, 16, Dk block] tensor).
  backward  4. dS:       the reverse walk over chunks: dS_n = exp(b_last) dS_{n+1}
                         + sum over the group's query heads of (q * exp(b))^T dO; stores the
                         gradient of the state leaving each chunk (dS_0 = d initial_state)
            5. dq:       per query sub-chunk, the mirror of step 3 with dA = dO v^T
            6. dk, dv:   per key sub-chunk and KV head, looping over the group's query heads and
                         over the later sub-chunks of the chunk, plus the state terms
                         dk += exp(b_last - b) * (v dS_{n+1}^T), dv += (k * exp(b_last - b)) dS_{n+1}
            7. dg:       with B_t the absolute cumulative log-decay, dL/dB_t = q_t dq_t - k_t dk_t
                         (+ rowsum(S_T * dS_T) at the last step), dg = its reverse cumsum over time
                         (plain PyTorch). S_n is recomputed by step 2 rather than kept from the
                         forward: a model's activations then hold no (N, Dk, Dv) states per layer.
Numerical safety: every exponent that reaches exp is <= 0 (decays relative to a reference point
at or after the key, before or at the query), so no strength of decay can overflow; rows past
T read b at T-1 (they hold zeros) so that they obey the same rule. This assumes what the
contract says, g <= 0 and finite (not checked: it would cost a pass over g).
Shapes: Dk and Dv up to 256, any value (padded to powers of two >= 16 with masks; the sub-chunk
kernels take Dk in blocks of up to MAX_BK = 64 and Dv in blocks, the dq/dk partial sums over Dv
blocks added in PyTorch), any T, chunk_size a power of two >= 16 (`supports` says so per case). Memory beyond
the inputs and outputs: b, and during each pass the states S_n (or their gradients),
(B, Hkv, T/C, Dk, Dv) fp32.

Runs natively on CUDA tensors; on CPU tensors only under the Triton interpreter, which needs
TRITON_INTERPRET=1 in the environment before this module is imported (attn_kernels/env.py answers where
the kernels can run). The same recurrence in plain PyTorch: attn_kernels/gla_chunked.py.
"""
import torch
import triton
import triton.language as tl

from attn_kernels.env import interpreted

__all__ = ["chunk_gla", "supports"]
interpreted()  # asked now, before the kernels below are decorated: the answer is theirs
MAX_HEAD_DIM = 256

SUB = 16  # rows of a sub-chunk: the intra-chunk scores are built from SUB x SUB blocks
_SUB = tl.constexpr(SUB)  # kernels may only read constexpr globals


# ----------------------------------------------------------------------------- loads

@triton.jit
def _tile(ptr, offs_t, offs_d, stride_t, stride_d, T, D):
    """[len(offs_t), len(offs_d)] tile of a (T, D) matrix in fp32, zero outside it."""
    return tl.load(ptr + offs_t[:, None] * stride_t + offs_d[None, :] * stride_d,
                   mask=(offs_t[:, None] < T) & (offs_d[None, :] < D), other=0.0).to(tl.float32)


@triton.jit
def _tile_t(ptr, offs_t, offs_d, stride_t, stride_d, T, D):
    """The same tile transposed: [len(offs_d), len(offs_t)]."""
    return tl.load(ptr + offs_t[None, :] * stride_t + offs_d[:, None] * stride_d,
                   mask=(offs_t[None, :] < T) & (offs_d[:, None] < D), other=0.0).to(tl.float32)


@triton.jit
def _row(ptr, t, offs_d, stride_t, stride_d, T, D):
    """Row t of a (T, D) matrix in fp32 [len(offs_d)], zero if t >= T."""
    offs_t = t + tl.zeros_like(offs_d)  # t as a vector: the mask is then a tensor wherever t came from
    return tl.load(ptr + offs_t * stride_t + offs_d * stride_d, mask=(offs_d < D) & (offs_t < T),
                   other=0.0).to(tl.float32)


@triton.jit
def _state_tile(pid_k, pid_v, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Rows, columns, offsets and mask of the [BK, BV] block (pid_k, pid_v) of a (DK, DV) state."""
    offs_k = pid_k * BK + tl.arange(0, BK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    return offs_k, offs_v, offs_k[:, None] * DV + offs_v[None, :], (offs_k[:, None] < DK) & (offs_v[None, :] < DV)


@triton.jit
def _state_or_zeros(ptr, state_offs, state_mask, GIVEN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """The [BK, BV] state block at ptr in fp32 when GIVEN, else zeros (no initial state / no gradient)."""
    if GIVEN:
        return tl.load(ptr + state_offs, mask=state_mask, other=0.0).to(tl.float32)
    return tl.zeros([BK, BV], tl.float32)


# ----------------------------------------------------------------------------- diagonal blocks
# Inside a SUB x SUB diagonal block the decay is pairwise, exp(b_i - b_j) for key j <= query i, the
# exponent set to -inf (exp 0) above the diagonal before exp. Compiled kernels (DIAG_LOOP) go one
# row or column at a time ([SUB, BK] tensors in registers); the interpreter, whose cost is per
# operation, takes all pairs as one [SUB, SUB, BK] tensor. Without decay the block is a plain dot.
# The helpers work on one Dk block (offs_k) of the SUB rows from `start`.

@triton.jit
def _pair_decay(b):
    """[SUB_i, SUB_j, BK]: exp(b_i - b_j) for j <= i, else 0; b [SUB, BK]."""
    sub = tl.arange(0, _SUB)
    return tl.exp(tl.where((sub[:, None] >= sub[None, :])[:, :, None], b[:, None, :] - b[None, :, :], float("-inf")))


@triton.jit
def _column_decay(b, BC, start, j, offs_k, T, DK: tl.constexpr):
    """[SUB_i, BK]: exp(b_i - b_j) for the rows i >= j of column j, else 0; b [SUB, BK] of the rows."""
    sub = tl.arange(0, _SUB)
    b_j = _row(BC, tl.minimum(start + j, T - 1), offs_k, DK, 1, T, DK)
    return tl.exp(tl.where(sub[:, None] >= j, b - b_j[None, :], float("-inf")))


@triton.jit
def _block_decay(BC, start, offs_k, T, DK: tl.constexpr):
    """b of the block's rows [SUB, BK] (rows past T read T-1's)."""
    return _tile(BC, tl.minimum(start + tl.arange(0, _SUB), T - 1), offs_k, DK, 1, T, DK)


@triton.jit
def _diag_scores(Q, K, BC, start, stride_qt, stride_qd, stride_kt, stride_kd, T, scale, DK: tl.constexpr,
                 BK: tl.constexpr, USE_G: tl.constexpr, DIAG_LOOP: tl.constexpr, DOT_PREC: tl.constexpr):
    """[SUB_i, SUB_j]: the diagonal block's scores, sum_d scale q_id k_jd exp(b_id - b_jd) for j <= i, else 0."""
    sub = tl.arange(0, _SUB)
    a = tl.zeros([_SUB, _SUB], tl.float32)
    for kb in range(0, DK, BK):
        offs_k = kb + tl.arange(0, BK)
        q = _tile(Q, start + sub, offs_k, stride_qt, stride_qd, T, DK) * scale  # [SUB, BK]
        if USE_G and DIAG_LOOP:  # column by column
            b = _block_decay(BC, start, offs_k, T, DK)
            for j in range(0, _SUB):
                k_j = _row(K, start + j, offs_k, stride_kt, stride_kd, T, DK)  # [BK]
                a += tl.where(sub[None, :] == j,
                              tl.sum(q * k_j[None, :] * _column_decay(b, BC, start, j, offs_k, T, DK), 1)[:, None],
                              0.0)
        elif USE_G:
            k = _tile(K, start + sub, offs_k, stride_kt, stride_kd, T, DK)
            a += tl.sum(q[:, None, :] * k[None, :, :] * _pair_decay(_block_decay(BC, start, offs_k, T, DK)), 2)
        else:
            a += tl.dot(q, tl.trans(_tile(K, start + sub, offs_k, stride_kt, stride_kd, T, DK)),
                        input_precision=DOT_PREC)
    return tl.where(sub[:, None] >= sub[None, :], a, 0.0)  # (with decay a no-op; else the causal mask)


@triton.jit
def _offdiag_scores(Q, K, BC, q_start, k_start, stride_qt, stride_qd, stride_kt, stride_kd, T, scale,
                    DK: tl.constexpr, BK: tl.constexpr, USE_G: tl.constexpr, DOT_PREC: tl.constexpr):
    """[SUB_i, SUB_j]: scores of the queries at q_start against the keys of an earlier sub-chunk of the
    same chunk at k_start, the decay factored through r = b at q_start: (scale q_i * exp(b_i - r)) .
    (k_j * exp(r - b_j)), both exponents <= 0."""
    offs_i = q_start + tl.arange(0, _SUB)
    offs_j = k_start + tl.arange(0, _SUB)
    a = tl.zeros([_SUB, _SUB], tl.float32)
    for kb in range(0, DK, BK):
        offs_k = kb + tl.arange(0, BK)
        q = _tile(Q, offs_i, offs_k, stride_qt, stride_qd, T, DK) * scale  # [SUB, BK]
        k = _tile(K, offs_j, offs_k, stride_kt, stride_kd, T, DK)
        if USE_G:
            r = _row(BC, q_start, offs_k, DK, 1, T, DK)  # [BK]
            q = q * tl.exp(_tile(BC, tl.minimum(offs_i, T - 1), offs_k, DK, 1, T, DK) - r[None, :])
            k = k * tl.exp(r[None, :] - _tile(BC, offs_j, offs_k, DK, 1, T, DK))  # keys before q_start < T
        a += tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
    return a


@triton.jit
def _diag_dq(da, K, BC, start, offs_k, stride_kt, stride_kd, T, DK: tl.constexpr, BK: tl.constexpr,
             USE_G: tl.constexpr, DIAG_LOOP: tl.constexpr, DOT_PREC: tl.constexpr):
    """[SUB_i, BK]: sum_j dA_ij k_j exp(b_i - b_j) over j <= i; da [SUB_i, SUB_j] zero above the diagonal."""
    sub = tl.arange(0, _SUB)
    if USE_G and DIAG_LOOP:  # column by column
        b = _block_decay(BC, start, offs_k, T, DK)
        dq = tl.zeros([_SUB, BK], tl.float32)
        for j in range(0, _SUB):
            k_j = _row(K, start + j, offs_k, stride_kt, stride_kd, T, DK)
            da_j = tl.sum(tl.where(sub[None, :] == j, da, 0.0), 1)  # [SUB_i]: column j of dA
            dq += da_j[:, None] * k_j[None, :] * _column_decay(b, BC, start, j, offs_k, T, DK)
    elif USE_G:
        k = _tile(K, start + sub, offs_k, stride_kt, stride_kd, T, DK)
        dq = tl.sum(da[:, :, None] * k[None, :, :] * _pair_decay(_block_decay(BC, start, offs_k, T, DK)), 1)
    else:
        dq = tl.dot(da, _tile(K, start + sub, offs_k, stride_kt, stride_kd, T, DK), input_precision=DOT_PREC)
    return dq


@triton.jit
def _diag_dk(da, Q, BC, start, offs_k, stride_qt, stride_qd, T, scale, DK: tl.constexpr, BK: tl.constexpr,
             USE_G: tl.constexpr, DIAG_LOOP: tl.constexpr, DOT_PREC: tl.constexpr):
    """[SUB_j, BK]: sum_i dA_ij q_i exp(b_i - b_j) * scale over i >= j; da [SUB_i, SUB_j] zero above
    the diagonal."""
    sub = tl.arange(0, _SUB)
    if USE_G and DIAG_LOOP:  # row by row: query i against the keys j <= i
        b = _block_decay(BC, start, offs_k, T, DK)
        dk = tl.zeros([_SUB, BK], tl.float32)
        for i in range(0, _SUB):
            q_i = _row(Q, start + i, offs_k, stride_qt, stride_qd, T, DK) * scale  # [BK]
            b_i = _row(BC, tl.minimum(start + i, T - 1), offs_k, DK, 1, T, DK)
            e = tl.exp(tl.where(sub[:, None] <= i, b_i[None, :] - b, float("-inf")))  # [SUB_j, BK]
            da_i = tl.sum(tl.where(sub[:, None] == i, da, 0.0), 0)  # [SUB_j]: row i of dA
            dk += da_i[:, None] * q_i[None, :] * e
    elif USE_G:
        q = _tile(Q, start + sub, offs_k, stride_qt, stride_qd, T, DK) * scale
        dk = tl.sum(da[:, :, None] * q[:, None, :] * _pair_decay(_block_decay(BC, start, offs_k, T, DK)), 0)
    else:
        dk = tl.dot(tl.trans(da), _tile(Q, start + sub, offs_k, stride_qt, stride_qd, T, DK) * scale,
                    input_precision=DOT_PREC)
    return dk


# ----------------------------------------------------------------------------- forward

@triton.jit
def _cumsum_kernel(G, BC, stride_gb, stride_gh, stride_gt, stride_gd, HKV, T,
                   DK: tl.constexpr, C: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    """Step 1: b = cumulative sum of g from each chunk's start, fp32 (B*Hkv, T, DK) contiguous."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_k = tl.program_id(2)
    G += (pid_bh // HKV).to(tl.int64) * stride_gb + (pid_bh % HKV).to(tl.int64) * stride_gh
    BC += pid_bh.to(tl.int64) * T * DK
    offs_k = pid_k * BK + tl.arange(0, BK)
    carry = tl.zeros([BK], tl.float32)  # sum of the chunk's earlier rows
    for r in range(0, C, BT):
        offs_t = pid_n * C + r + tl.arange(0, BT)
        g = _tile(G, offs_t, offs_k, stride_gt, stride_gd, T, DK)  # [BT, BK]
        tl.store(BC + offs_t[:, None] * DK + offs_k[None, :], tl.cumsum(g, 0) + carry[None, :],
                 mask=(offs_t[:, None] < T) & (offs_k[None, :] < DK))
        carry += tl.sum(g, 0)


@triton.jit
def _chunk_end_decay(BC, n, offs_k, T, DK: tl.constexpr, C: tl.constexpr):
    """b at the chunk's last row (T - 1 for the ragged tail): [BK], <= 0."""
    return _row(BC, tl.minimum((n + 1) * C, T) - 1, offs_k, DK, 1, T, DK)


@triton.jit
def _fwd_state_kernel(K, V, BC, H0, HS, HT, stride_kb, stride_kh, stride_kt, stride_kd,
                      stride_vb, stride_vh, stride_vt, stride_vd, HKV, T, NT,
                      DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr, BT: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr, USE_G: tl.constexpr, HAS_H0: tl.constexpr,
                      STORE_HT: tl.constexpr, DOT_PREC: tl.constexpr):
    """Step 2: walk the chunks in order; store the state entering each (fp32 (B*Hkv, NT, DK, DV))."""
    pid_k = tl.program_id(0)
    pid_v = tl.program_id(1)
    pid_bh = tl.program_id(2)
    bh = pid_bh.to(tl.int64)
    K += (pid_bh // HKV).to(tl.int64) * stride_kb + (pid_bh % HKV).to(tl.int64) * stride_kh
    V += (pid_bh // HKV).to(tl.int64) * stride_vb + (pid_bh % HKV).to(tl.int64) * stride_vh
    BC += bh * T * DK
    HS += bh * NT * DK * DV
    offs_k, offs_v, state_offs, state_mask = _state_tile(pid_k, pid_v, DK, DV, BK, BV)
    state = _state_or_zeros(H0 + bh * DK * DV, state_offs, state_mask, HAS_H0, BK, BV)
    for n in range(0, NT):
        tl.store(HS + n * DK * DV + state_offs, state, mask=state_mask)
        if USE_G:
            b_last = _chunk_end_decay(BC, n, offs_k, T, DK, C)  # [BK]
            state = state * tl.exp(b_last)[:, None]
        for r in range(0, C, BT):  # the chunk's contribution, BT rows at a time
            offs_t = n * C + r + tl.arange(0, BT)
            kt = _tile_t(K, offs_t, offs_k, stride_kt, stride_kd, T, DK)  # [BK, BT]
            if USE_G:  # rows past T read b[T-1]: exponent 0, and their k is 0
                bt = _tile_t(BC, tl.minimum(offs_t, T - 1), offs_k, DK, 1, T, DK)  # [BK, BT]
                kt = kt * tl.exp(b_last[:, None] - bt)  # decay from the key to the chunk's end, <= 1
            v = _tile(V, offs_t, offs_v, stride_vt, stride_vd, T, DV)  # [BT, BV]
            state += tl.dot(kt, v, input_precision=DOT_PREC)
    if STORE_HT:
        tl.store(HT + bh * DK * DV + state_offs, state, mask=state_mask)


@triton.jit
def _fwd_output_kernel(Q, K, V, BC, HS, O, stride_qb, stride_qh, stride_qt, stride_qd,
                       stride_kb, stride_kh, stride_kt, stride_kd, stride_vb, stride_vh, stride_vt, stride_vd,
                       stride_ob, stride_oh, stride_ot, stride_od, H, GROUP, T, NT, scale,
                       DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                       BV: tl.constexpr, USE_G: tl.constexpr, DIAG_LOOP: tl.constexpr, DOT_PREC: tl.constexpr):
    """Step 3: o for SUB query rows of one query head and one Dv block (Dk in blocks of BK)."""
    pid_s = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_v = tl.program_id(2)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    bhkv = b * (H // GROUP) + h // GROUP  # batch * Hkv + KV head
    start = pid_s * _SUB
    n = start // C
    offs_i = start + tl.arange(0, _SUB)
    rows_i = tl.minimum(offs_i, T - 1)  # b of rows past T: that of T-1 (their q, k, v are 0)
    sub = tl.arange(0, _SUB)
    offs_v = pid_v * BV + tl.arange(0, BV)
    Q += b * stride_qb + h.to(tl.int64) * stride_qh
    K += b * stride_kb + (h // GROUP).to(tl.int64) * stride_kh
    V += b * stride_vb + (h // GROUP).to(tl.int64) * stride_vh
    BC += bhkv * T * DK
    HS += (bhkv * NT + n) * DK * DV

    # what the earlier chunks left in the state, decayed from the chunk's start to each query
    acc = tl.zeros([_SUB, BV], tl.float32)
    for kb in range(0, DK, BK):
        offs_k = kb + tl.arange(0, BK)
        q = _tile(Q, offs_i, offs_k, stride_qt, stride_qd, T, DK) * scale  # [SUB, BK]
        if USE_G:
            q = q * tl.exp(_tile(BC, rows_i, offs_k, DK, 1, T, DK))  # exp(b_i) <= 1
        s_n = tl.load(HS + offs_k[:, None] * DV + offs_v[None, :],
                      mask=(offs_k[:, None] < DK) & (offs_v[None, :] < DV), other=0.0)  # [BK, BV]
        acc += tl.dot(q, s_n, input_precision=DOT_PREC)
    # the earlier sub-chunks of the chunk, then the diagonal block
    for t0 in range(n * C, start, _SUB):
        a = _offdiag_scores(Q, K, BC, start, t0, stride_qt, stride_qd, stride_kt, stride_kd, T, scale,
                            DK, BK, USE_G, DOT_PREC)
        acc += tl.dot(a, _tile(V, t0 + sub, offs_v, stride_vt, stride_vd, T, DV), input_precision=DOT_PREC)
    a = _diag_scores(Q, K, BC, start, stride_qt, stride_qd, stride_kt, stride_kd, T, scale, DK, BK, USE_G, DIAG_LOOP,
                     DOT_PREC)
    acc += tl.dot(a, _tile(V, offs_i, offs_v, stride_vt, stride_vd, T, DV), input_precision=DOT_PREC)
    tl.store(O + b * stride_ob + h.to(tl.int64) * stride_oh + offs_i[:, None] * stride_ot + offs_v[None, :] * stride_od,
             acc.to(O.dtype.element_ty), mask=(offs_i[:, None] < T) & (offs_v[None, :] < DV))


# ----------------------------------------------------------------------------- backward

@triton.jit
def _bwd_state_kernel(Q, DO, BC, DHT, DHS, DH0, stride_qb, stride_qh, stride_qt, stride_qd,
                      stride_dob, stride_doh, stride_dot, stride_dod, HKV, GROUP, T, NT, scale,
                      DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr, BT: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr, USE_G: tl.constexpr, HAS_DHT: tl.constexpr,
                      DOT_PREC: tl.constexpr):
    """Step 4: walk the chunks backwards; store the gradient of the state leaving each chunk
    (fp32 (B*Hkv, NT, DK, DV)) and, at the end, that of the initial state."""
    pid_k = tl.program_id(0)
    pid_v = tl.program_id(1)
    pid_bh = tl.program_id(2)
    bh = pid_bh.to(tl.int64)
    b = (pid_bh // HKV).to(tl.int64)
    hkv = pid_bh % HKV
    BC += bh * T * DK
    DHS += bh * NT * DK * DV
    offs_k, offs_v, state_offs, state_mask = _state_tile(pid_k, pid_v, DK, DV, BK, BV)
    ds = _state_or_zeros(DHT + bh * DK * DV, state_offs, state_mask, HAS_DHT, BK, BV)
    for i in range(0, NT):
        n = NT - 1 - i
        tl.store(DHS + n * DK * DV + state_offs, ds, mask=state_mask)
        if USE_G:
            ds = ds * tl.exp(_chunk_end_decay(BC, n, offs_k, T, DK, C))[:, None]
        for hq in range(0, GROUP):  # every query head of the group read this state
            h = (hkv * GROUP + hq).to(tl.int64)
            Qh = Q + b * stride_qb + h * stride_qh
            DOh = DO + b * stride_dob + h * stride_doh
            for r in range(0, C, BT):
                offs_t = n * C + r + tl.arange(0, BT)
                qt = _tile_t(Qh, offs_t, offs_k, stride_qt, stride_qd, T, DK) * scale  # [BK, BT]
                if USE_G:
                    qt = qt * tl.exp(_tile_t(BC, tl.minimum(offs_t, T - 1), offs_k, DK, 1, T, DK))
                do = _tile(DOh, offs_t, offs_v, stride_dot, stride_dod, T, DV)  # [BT, BV]
                ds += tl.dot(qt, do, input_precision=DOT_PREC)
    tl.store(DH0 + bh * DK * DV + state_offs, ds, mask=state_mask)


@triton.jit
def _bwd_dq_kernel(K, V, DO, BC, HS, DQ, stride_kb, stride_kh, stride_kt, stride_kd,
                   stride_vb, stride_vh, stride_vt, stride_vd, stride_dob, stride_doh, stride_dot, stride_dod,
                   B, H, GROUP, T, NT, scale, DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr, USE_G: tl.constexpr, DIAG_LOOP: tl.constexpr,
                   DOT_PREC: tl.constexpr):
    """Step 5: dq of SUB query rows from one Dv block, Dk block by Dk block; DQ fp32
    (NV, B*H, T, DK), summed over NV later."""
    pid_s = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_v = tl.program_id(2)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    bhkv = b * (H // GROUP) + h // GROUP
    start = pid_s * _SUB
    n = start // C
    offs_i = start + tl.arange(0, _SUB)
    rows_i = tl.minimum(offs_i, T - 1)
    sub = tl.arange(0, _SUB)
    offs_v = pid_v * BV + tl.arange(0, BV)
    K += b * stride_kb + (h // GROUP).to(tl.int64) * stride_kh
    V += b * stride_vb + (h // GROUP).to(tl.int64) * stride_vh
    BC += bhkv * T * DK
    HS += (bhkv * NT + n) * DK * DV
    DQ += (pid_v.to(tl.int64) * B * H + pid_bh) * T * DK
    do = _tile(DO + b * stride_dob + h.to(tl.int64) * stride_doh, offs_i, offs_v, stride_dot, stride_dod, T, DV)
    da_diag = tl.dot(do, tl.trans(_tile(V, offs_i, offs_v, stride_vt, stride_vd, T, DV)), input_precision=DOT_PREC)
    da_diag = tl.where(sub[:, None] >= sub[None, :], da_diag, 0.0)  # [SUB_i, SUB_j], j <= i
    for kb in range(0, DK, BK):
        offs_k = kb + tl.arange(0, BK)
        s_n = tl.load(HS + offs_k[:, None] * DV + offs_v[None, :],
                      mask=(offs_k[:, None] < DK) & (offs_v[None, :] < DV), other=0.0)  # [BK, BV]
        dq = tl.dot(do, tl.trans(s_n), input_precision=DOT_PREC)  # [SUB, BK]: through the state
        if USE_G:
            b_i = _tile(BC, rows_i, offs_k, DK, 1, T, DK)  # [SUB, BK]
            dq = dq * tl.exp(b_i)
            r = _row(BC, start, offs_k, DK, 1, T, DK)
        dq_r = tl.zeros([_SUB, BK], tl.float32)  # earlier sub-chunks, still to be decayed from r
        for t0 in range(n * C, start, _SUB):
            offs_j = t0 + tl.arange(0, _SUB)
            k = _tile(K, offs_j, offs_k, stride_kt, stride_kd, T, DK)
            if USE_G:
                k = k * tl.exp(r[None, :] - _tile(BC, offs_j, offs_k, DK, 1, T, DK))
            da = tl.dot(do, tl.trans(_tile(V, offs_j, offs_v, stride_vt, stride_vd, T, DV)), input_precision=DOT_PREC)
            dq_r += tl.dot(da, k, input_precision=DOT_PREC)
        if USE_G:
            dq += dq_r * tl.exp(b_i - r[None, :])
        else:
            dq += dq_r
        dq += _diag_dq(da_diag, K, BC, start, offs_k, stride_kt, stride_kd, T, DK, BK, USE_G, DIAG_LOOP, DOT_PREC)
        tl.store(DQ + offs_i[:, None] * DK + offs_k[None, :], dq * scale,
                 mask=(offs_i[:, None] < T) & (offs_k[None, :] < DK))


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, BC, DHS, DK_, DV_, stride_qb, stride_qh, stride_qt, stride_qd,
                     stride_kb, stride_kh, stride_kt, stride_kd, stride_vb, stride_vh, stride_vt, stride_vd,
                     stride_dob, stride_doh, stride_dot, stride_dod, B, HKV, GROUP, T, NT, scale,
                     DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                     BV: tl.constexpr, USE_G: tl.constexpr, DIAG_LOOP: tl.constexpr, DOT_PREC: tl.constexpr):
    """Step 6: dv (DV_ fp32 (B*Hkv, T, DV)) and dk (partial over Dv blocks: DK_ fp32
    (NV, B*Hkv, T, DK)) of SUB key rows of one KV head, summed over its query heads.
    dv first (it needs the scores summed over all of Dk), then dk Dk block by Dk block."""
    pid_s = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_v = tl.program_id(2)
    bh = pid_bh.to(tl.int64)
    b = (pid_bh // HKV).to(tl.int64)
    hkv = pid_bh % HKV
    start = pid_s * _SUB
    n = start // C
    end = tl.minimum((n + 1) * C, T)  # the chunk's end
    offs_j = start + tl.arange(0, _SUB)
    rows_j = tl.minimum(offs_j, T - 1)
    sub = tl.arange(0, _SUB)
    causal = sub[:, None] >= sub[None, :]  # [SUB_i, SUB_j]: key j <= query i
    offs_v = pid_v * BV + tl.arange(0, BV)
    K += b * stride_kb + hkv.to(tl.int64) * stride_kh
    V += b * stride_vb + hkv.to(tl.int64) * stride_vh
    BC += bh * T * DK
    DHS += (bh * NT + n) * DK * DV
    v = _tile(V, offs_j, offs_v, stride_vt, stride_vd, T, DV)  # [SUB, BV]

    # dv through the state leaving the chunk: S_{n+1} += (k * exp(b_last - b))^T v
    dv = tl.zeros([_SUB, BV], tl.float32)
    for kb in range(0, DK, BK):
        offs_k = kb + tl.arange(0, BK)
        k = _tile(K, offs_j, offs_k, stride_kt, stride_kd, T, DK)  # [SUB, BK]
        if USE_G:
            k = k * tl.exp(_row(BC, end - 1, offs_k, DK, 1, T, DK)[None, :] - _tile(BC, rows_j, offs_k, DK, 1, T, DK))
        ds = tl.load(DHS + offs_k[:, None] * DV + offs_v[None, :],
                     mask=(offs_k[:, None] < DK) & (offs_v[None, :] < DV), other=0.0)  # [BK, BV]
        dv += tl.dot(k, ds, input_precision=DOT_PREC)
    # dv += A^T dO over the query heads that read this KV head
    for hq in range(0, GROUP):
        h = (hkv * GROUP + hq).to(tl.int64)
        Qh = Q + b * stride_qb + h * stride_qh
        DOh = DO + b * stride_dob + h * stride_doh
        for s0 in range(start + _SUB, end, _SUB):  # the later sub-chunks, then the diagonal block
            a = _offdiag_scores(Qh, K, BC, s0, start, stride_qt, stride_qd, stride_kt, stride_kd, T, scale,
                                DK, BK, USE_G, DOT_PREC)  # [SUB_i, SUB_j]
            dv += tl.dot(tl.trans(a), _tile(DOh, s0 + sub, offs_v, stride_dot, stride_dod, T, DV),
                         input_precision=DOT_PREC)
        a = _diag_scores(Qh, K, BC, start, stride_qt, stride_qd, stride_kt, stride_kd, T, scale, DK, BK, USE_G,
                         DIAG_LOOP, DOT_PREC)
        dv += tl.dot(tl.trans(a), _tile(DOh, offs_j, offs_v, stride_dot, stride_dod, T, DV), input_precision=DOT_PREC)
    tl.store(DV_ + bh * T * DV + offs_j[:, None] * DV + offs_v[None, :], dv,
             mask=(offs_j[:, None] < T) & (offs_v[None, :] < DV))

    # dk, one Dk block at a time
    DK_ += (pid_v.to(tl.int64) * B * HKV + bh) * T * DK
    for kb in range(0, DK, BK):
        offs_k = kb + tl.arange(0, BK)
        ds = tl.load(DHS + offs_k[:, None] * DV + offs_v[None, :],
                     mask=(offs_k[:, None] < DK) & (offs_v[None, :] < DV), other=0.0)
        dk = tl.dot(v, tl.trans(ds), input_precision=DOT_PREC)  # [SUB, BK]: through the state
        if USE_G:
            b_j = _tile(BC, rows_j, offs_k, DK, 1, T, DK)  # [SUB, BK]
            dk = dk * tl.exp(_row(BC, end - 1, offs_k, DK, 1, T, DK)[None, :] - b_j)  # <= 1
        for hq in range(0, GROUP):
            h = (hkv * GROUP + hq).to(tl.int64)
            Qh = Q + b * stride_qb + h * stride_qh
            DOh = DO + b * stride_dob + h * stride_doh
            for s0 in range(start + _SUB, end, _SUB):
                offs_i = s0 + tl.arange(0, _SUB)
                q = _tile(Qh, offs_i, offs_k, stride_qt, stride_qd, T, DK) * scale  # [SUB, BK]
                if USE_G:
                    r = _row(BC, s0, offs_k, DK, 1, T, DK)
                    q = q * tl.exp(_tile(BC, tl.minimum(offs_i, T - 1), offs_k, DK, 1, T, DK) - r[None, :])
                da = tl.dot(_tile(DOh, offs_i, offs_v, stride_dot, stride_dod, T, DV), tl.trans(v),
                            input_precision=DOT_PREC)  # [SUB_i, SUB_j]
                dk_r = tl.dot(tl.trans(da), q, input_precision=DOT_PREC)  # [SUB_j, BK]
                if USE_G:
                    dk += dk_r * tl.exp(r[None, :] - b_j)
                else:
                    dk += dk_r
            da = tl.dot(_tile(DOh, offs_j, offs_v, stride_dot, stride_dod, T, DV), tl.trans(v),
                        input_precision=DOT_PREC)
            da = tl.where(causal, da, 0.0)  # the diagonal block
            dk += _diag_dk(da, Qh, BC, start, offs_k, stride_qt, stride_qd, T, scale, DK, BK, USE_G, DIAG_LOOP,
                           DOT_PREC)
        tl.store(DK_ + offs_j[:, None] * DK + offs_k[None, :], dk, mask=(offs_j[:, None] < T) & (offs_k[None, :] < DK))


# The diagonal blocks row by row or column by column when compiled, all pairs at once when
# interpreted (see the diagonal-block helpers); tests/attn_kernels/test_gla.py runs the loops under the
# interpreter too.
DIAG_LOOP = not interpreted()

# ----------------------------------------------------------------------------- launch

# Largest Dk block and (Dk block, Dv block) state tile of the sub-chunk kernels, by dot precision
# (exact fp32 dots run on FMA units and need more registers than TF32 tensor-core ones): with
# these, no sm_90 build spills registers (python -m tools.compile_check).
MAX_BK = {"ieee": 64, "tf32": 64}
MAX_STATE_TILE = {"ieee": 2048, "tf32": 8192}


def _blocks(dk, dv, chunk, prec):
    """Block sizes: the sub-chunk kernels loop over Dk in blocks of BK and split Dv into NV
    blocks of BV; the walks over chunks split the state into (SK, SV) tiles and read BT rows at
    a time."""
    bk = min(max(16, triton.next_power_of_2(dk)), MAX_BK[prec])
    bv_full = max(16, triton.next_power_of_2(dv))
    bv = min(bv_full, max(16, MAX_STATE_TILE[prec] // bk))
    return dict(BK=bk, BV=bv, NV=triton.cdiv(dv, bv), SK=min(64, bk), SV=min(64, bv_full), BT=min(64, chunk))


def _warps(bk, bv, prec, heavy=False):
    """8 warps for large tiles, exact fp32 dots and the dk/dv kernel (the most live tensors)."""
    return 4 if bk * bv <= 4096 and prec == "tf32" and not heavy else 8


def _cumsum(g, C, Hkv, T, Dk, blk):
    bc = torch.empty(g.shape[0], Hkv, T, Dk, device=g.device, dtype=torch.float32)
    grid = (triton.cdiv(T, C), g.shape[0] * Hkv, triton.cdiv(Dk, blk["SK"]))
    _cumsum_kernel[grid](g, bc, *g.stride(), Hkv, T, DK=Dk, C=C, BT=blk["BT"], BK=blk["SK"])
    return bc


def _states(k, v, bc, h0, C, blk, prec, store_ht):
    """Step 2: (states entering each chunk (B, Hkv, N, Dk, Dv), final state or None)."""
    B, Hkv, T, Dk = k.shape
    Dv, N = v.shape[-1], triton.cdiv(T, C)
    hs = torch.empty(B, Hkv, N, Dk, Dv, device=k.device, dtype=torch.float32)
    ht = torch.empty(B, Hkv, Dk, Dv, device=k.device, dtype=torch.float32) if store_ht else None
    grid = (triton.cdiv(Dk, blk["SK"]), triton.cdiv(Dv, blk["SV"]), B * Hkv)
    _fwd_state_kernel[grid](k, v, bc if bc is not None else k, h0 if h0 is not None else k, hs,
                            ht if ht is not None else hs, *k.stride(), *v.stride(), Hkv, T, N,
                            DK=Dk, DV=Dv, C=C, BT=blk["BT"], BK=blk["SK"], BV=blk["SV"], USE_G=bc is not None,
                            HAS_H0=h0 is not None, STORE_HT=store_ht, DOT_PREC=prec,
                            num_warps=_warps(blk["SK"], blk["SV"], prec))
    return hs, ht


def _gla_fwd(q, k, v, g, h0, scale, C, store_ht):
    B, H, T, Dk = q.shape
    Hkv, Dv = k.shape[1], v.shape[-1]
    prec = _dot_precision(q, k, v)
    blk = _blocks(Dk, Dv, C, prec)
    bc = _cumsum(g, C, Hkv, T, Dk, blk) if g is not None else None
    hs, ht = _states(k, v, bc, h0, C, blk, prec, store_ht)
    o = torch.empty(B, H, T, Dv, device=q.device, dtype=q.dtype)
    _fwd_output_kernel[(triton.cdiv(T, SUB), B * H, blk["NV"])](
        q, k, v, bc if bc is not None else q, hs, o, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, H // Hkv, T, hs.shape[2], scale, DK=Dk, DV=Dv, C=C, BK=blk["BK"], BV=blk["BV"],
        USE_G=bc is not None, DIAG_LOOP=DIAG_LOOP, DOT_PREC=prec, num_warps=_warps(blk["BK"], blk["BV"], prec))
    return o, bc, ht


def _gla_bwd(do, dht, q, k, v, bc, h0, scale, C):
    """Gradients in fp32: dq, dk, dv, dB (dL/d of the absolute cumulative decay, or None), dh0."""
    B, H, T, Dk = q.shape
    Hkv, Dv = k.shape[1], v.shape[-1]
    prec = _dot_precision(q, k, v)
    blk = _blocks(Dk, Dv, C, prec)
    use_g = bc is not None
    hs, ht = _states(k, v, bc, h0, C, blk, prec, store_ht=use_g and dht is not None)  # recomputed
    N, NV = hs.shape[2], blk["NV"]
    # 4. gradients of the state leaving each chunk, and of the initial state
    dhs, dh0 = torch.empty_like(hs), torch.empty(B, Hkv, Dk, Dv, device=q.device, dtype=torch.float32)
    _bwd_state_kernel[(triton.cdiv(Dk, blk["SK"]), triton.cdiv(Dv, blk["SV"]), B * Hkv)](
        q, do, bc if use_g else q, dht if dht is not None else q, dhs, dh0, *q.stride(), *do.stride(),
        Hkv, H // Hkv, T, N, scale, DK=Dk, DV=Dv, C=C, BT=blk["BT"], BK=blk["SK"], BV=blk["SV"],
        USE_G=use_g, HAS_DHT=dht is not None, DOT_PREC=prec, num_warps=_warps(blk["SK"], blk["SV"], prec))
    meta = dict(DK=Dk, DV=Dv, C=C, BK=blk["BK"], BV=blk["BV"], USE_G=use_g, DIAG_LOOP=DIAG_LOOP, DOT_PREC=prec)
    # 5. dq
    dq = torch.empty(NV, B, H, T, Dk, device=q.device, dtype=torch.float32)
    _bwd_dq_kernel[(triton.cdiv(T, SUB), B * H, NV)](
        k, v, do, bc if use_g else q, hs, dq, *k.stride(), *v.stride(), *do.stride(), B, H, H // Hkv, T, N,
        scale, **meta, num_warps=_warps(blk["BK"], blk["BV"], prec))
    # 6. dk, dv
    dk = torch.empty(NV, B, Hkv, T, Dk, device=q.device, dtype=torch.float32)
    dv = torch.empty(B, Hkv, T, Dv, device=q.device, dtype=torch.float32)
    _bwd_dkdv_kernel[(triton.cdiv(T, SUB), B * Hkv, NV)](
        q, k, v, do, bc if use_g else q, dhs, dk, dv, *q.stride(), *k.stride(), *v.stride(), *do.stride(),
        B, Hkv, H // Hkv, T, N, scale, **meta, num_warps=_warps(blk["BK"], blk["BV"], prec, heavy=True),
        num_stages=1 if prec == "ieee" else 2)  # fewer loads in flight: no register spills
    dq, dk = (x[0] if NV == 1 else x.sum(0) for x in (dq, dk))
    db = None
    if use_g:  # 7. dL/dB_t = q_t dq_t - k_t dk_t (+ rowsum(S_T * dS_T) at t = T-1)
        db = (q.float() * dq).view(B, Hkv, H // Hkv, T, Dk).sum(2) - k.float() * dk
        if dht is not None:
            db[:, :, -1] += (ht * dht).sum(-1)
    return dq, dk, dv, db, dh0


def _dot_precision(q, k, v):
    """IEEE fp32 dots when all inputs are fp32 (exact tests); TF32 (more mantissa than
    fp16/bf16 inputs carry) otherwise."""
    return "ieee" if q.dtype == k.dtype == v.dtype == torch.float32 else "tf32"


class _ChunkGLA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, initial_state, scale, output_final_state, chunk_size):
        h0 = initial_state.float().contiguous() if initial_state is not None else None
        o, bc, ht = _gla_fwd(q, k, v, g, h0, scale, chunk_size, output_final_state)
        ctx.save_for_backward(q, k, v, bc, h0)  # b (the cumulative decay) instead of g
        ctx.args = (scale, chunk_size, g is not None, g.dtype if g is not None else None,
                    initial_state.dtype if initial_state is not None else None)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, bc, h0 = ctx.saved_tensors
        scale, C, use_g, g_dtype, h0_dtype = ctx.args
        dht = dht.float().contiguous() if dht is not None else None
        dq, dk, dv, db, dh0 = _gla_bwd(do, dht, q, k, v, bc, h0, scale, C)
        dg = db.flip(-2).cumsum(-2).flip(-2).to(g_dtype) if use_g else None  # reverse cumsum over time
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg,
                dh0.to(h0_dtype) if h0_dtype is not None else None, None, None, None)


def supports(chunk_size: int, head_dim_k: int, head_dim_v: int):
    """None when chunk_gla takes this case, else why not (one phrase, for logs and errors)."""
    if chunk_size < 16 or chunk_size & (chunk_size - 1):
        return f"chunk_size must be a power of two >= 16; got {chunk_size}"
    if max(head_dim_k, head_dim_v) > MAX_HEAD_DIM:
        return f"need head dims <= {MAX_HEAD_DIM}; got Dk={head_dim_k}, Dv={head_dim_v}"
    return None


def _check(q, k, v, g, initial_state, chunk_size):
    """One clear ValueError per kind of bad input."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be (batch, heads, time, dim)")
    B, H, T, Dk = q.shape
    Hkv = k.shape[1]
    if k.shape != (B, Hkv, T, Dk) or v.shape[:3] != (B, Hkv, T) or Hkv == 0 or H % Hkv:
        raise ValueError(f"incompatible shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: "
                         "need k (B, Hkv, T, Dk), v (B, Hkv, T, Dv) with H a multiple of Hkv")
    if g is not None and g.shape != k.shape:
        raise ValueError(f"g must have k's shape {tuple(k.shape)}; got {tuple(g.shape)}")
    state_shape = (B, Hkv, Dk, v.shape[-1])
    if initial_state is not None and initial_state.shape != state_shape:
        raise ValueError(f"initial_state must be {state_shape}; got {tuple(initial_state.shape)}")
    floats = (torch.float16, torch.bfloat16, torch.float32)
    if any(x is not None and x.dtype not in floats for x in (q, k, v, g, initial_state)):
        raise ValueError("q, k, v, g, initial_state must be fp16, bf16 or fp32")
    if T == 0:
        raise ValueError("need T >= 1")
    why_not = supports(chunk_size, Dk, v.shape[-1])
    if why_not:
        raise ValueError(why_not)
    if any(x is not None and x.device != q.device for x in (k, v, g, initial_state)):
        raise ValueError("q, k, v, g, initial_state must be on the same device")
    if B * H > 65535:  # grid axis 1
        raise ValueError(f"batch * heads = {B * H} exceeds 65535")
    if q.device.type == "cpu" and not interpreted():
        raise RuntimeError("chunk_gla on CPU tensors needs the Triton interpreter: set TRITON_INTERPRET=1 "
                           "before importing attn_kernels.gla, or use attn_kernels.gla_chunked.chunk_gla")


@torch.compiler.disable
def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, chunk_size=64):
    """Chunked GLA (see the module docstring). Returns o (B, H, T, Dv) in q's dtype and the final
    state (B, Hkv, Dk, Dv) fp32, or None unless output_final_state. Differentiable in q, k, v, g
    and initial_state. scale None means Dk ** -0.5."""
    _check(q, k, v, g, initial_state, chunk_size)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return _ChunkGLA.apply(q, k, v, g, initial_state, scale, bool(output_final_state), int(chunk_size))
