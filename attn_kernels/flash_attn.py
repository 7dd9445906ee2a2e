"""FlashAttention-2 in Triton, forward and backward, for training.

    o = flash_attention(q, k, v, causal=True, softmax_scale=None, alibi_slopes=None, block_layout=None,
                        forget=None)

q (B, H, Tq, Dqk), k (B, Hkv, Tk, Dqk), v (B, Hkv, Tk, Dv); fp16, bf16 or fp32, fp32 accumulation.

Algorithm (Dao 2023, "FlashAttention-2"):
  forward   one program per (query tile, batch*head): the Q tile stays on chip, K/V tiles stream
            past it, an online softmax keeps a running row max m and row sum l; the output is
            rescaled once at the end and the log-sum-exp lse = m + log(l) is saved.
  backward  1. preprocess: delta = rowsum(dO * O)
            2. dK/dV kernel: one program per key tile, looping over the query heads of its KV
               group (GQA/MQA without copying K/V) and over query tiles; P is recomputed from lse.
            3. dQ kernel: one program per query tile, looping over key tiles.
            Separate kernels, no atomics: the backward is deterministic.

Conventions
  * scores are kept in base 2: s2 = (q.k * scale + alibi) * log2(e), so softmax uses exp2.
  * causal masks align to the bottom right (as FlashAttention): query i sees key j iff
    j <= i + Tk - Tq. A query row that sees no key gets output 0 and lse = -inf.
  * ALiBi: bias = slope[h] * (j - (i + Tk - Tq)) for every (i, j) pair, causal or not.
    Slopes are constants (no gradient).
  * forget (FoX, attention/fox.py): (c_q (B, H, Tq), c_k (B, H, Tk)) fp32, bias = c_q[i] - c_k[j],
    loaded per tile (no T x T tensor); differentiable: dc_q[i] = sum_j dS[i, j] (the dQ kernel),
    dc_k[j] = -sum_i dS[i, j] (the dK/dV kernel, per query head of the group).
  * block_layout: bool/int tensor (n_q_blocks, n_k_blocks) or (H, n_q_blocks, n_k_blocks) at
    granularity `block_size` tokens (default 64); query block qb visits key block kb iff
    layout[.., qb, kb]. It may be larger than needed (it is cropped). Tokens in blocks that are
    off count as masked; causal masking still applies inside the visited blocks.
  * window W (causal only): query i also needs j > i + Tk - Tq - W (its last W positions); the
    key tiles wholly before the window are skipped, those across its edge masked.
  * head dims up to 256, any value (padded to a power of two with masks); any sequence length.

Runs natively on CUDA tensors; on CPU tensors only under the Triton interpreter, which needs
TRITON_INTERPRET=1 in the environment before this module is imported (attn_kernels/env.py answers where
the kernels can run). `supports(...)` says which cases the kernel takes.
"""
import math
import os
import time

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from attn_kernels.env import interpreted

interpreted()  # asked now, before the kernels below are decorated: the answer is theirs

LOG2E = 1.4426950408889634
_LOG2E = tl.constexpr(LOG2E)  # kernels may only read constexpr globals
_LN2 = tl.constexpr(0.6931471805599453)
MAX_HEAD_DIM = 256


def supports(head_dim_qk: int, head_dim_v: int, dropout: float = 0.0, layout_block: int | None = None,
             masked: bool = False, window: int | None = None):
    """None when flash_attention takes this case, else why not (one phrase, for logs and errors):
    head dims up to MAX_HEAD_DIM, no dropout, no element mask (masked: the path restricts keys
    token by token), a block layout's granularity a power of two >= 16; any window (sliding windows
    are masked in the kernel)."""
    if dropout > 0:
        return "dropout > 0"
    if masked:
        return "the path carries an element mask, which the kernel does not take (only block layouts)"
    if max(head_dim_qk, head_dim_v) > MAX_HEAD_DIM:
        return f"need head dims <= {MAX_HEAD_DIM}; got {head_dim_qk} (q.k) and {head_dim_v} (v)"
    if layout_block is not None and (layout_block < 16 or layout_block & (layout_block - 1)):
        return f"block layout granularity must be a power of two >= 16; got {layout_block}"
    return None


# ----------------------------------------------------------------------------- tile ranges

@triton.jit
def _key_tiles(LUT, LUT_CNT, h, pid_m, lut_sh, lut_sm, cnt_sh, start_m, Tq, Tk, window, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_LAYOUT: tl.constexpr):
    """Key tiles of a query tile, in three ranges: [n_lo, n_mid) straddle the window's far edge
    (masked; empty without a window), [n_mid, n_full) are wholly visible (no mask), [n_full, n_end)
    straddle the causal diagonal or the end (masked). With a layout, all n_end listed tiles
    (lut[0:n_end]) take the masked path."""
    lut = LUT
    n_lo = 0
    n_mid = 0
    if HAS_LAYOUT:
        lut = LUT + h * lut_sh + pid_m * lut_sm
        n_full = 0
        n_end = tl.load(LUT_CNT + h * cnt_sh + pid_m)
    elif CAUSAL:  # the tile's first row sees keys < start_m + Tk - Tq + 1, its last < start_m + BLOCK_M + Tk - Tq
        n_full = tl.maximum(tl.minimum(Tk, start_m + Tk - Tq + 1), 0) // BLOCK_N
        n_end = tl.cdiv(tl.maximum(tl.minimum(Tk, start_m + BLOCK_M + Tk - Tq), 0), BLOCK_N)
        # the window: the first row sees keys > start_m + Tk - Tq - window, the last row keys
        # > start_m + BLOCK_M - 1 + Tk - Tq - window; tiles past the last row's edge are whole
        n_lo = tl.maximum(start_m + Tk - Tq - window + 1, 0) // BLOCK_N
        n_mid = tl.cdiv(tl.maximum(start_m + BLOCK_M + Tk - Tq - window, 0), BLOCK_N)
        n_mid = tl.minimum(tl.maximum(n_mid, n_lo), n_full)
    else:
        n_full = Tk // BLOCK_N
        n_end = tl.cdiv(Tk, BLOCK_N)
    return lut, n_lo, n_mid, n_full, n_end


@triton.jit
def _query_tiles(LUT, LUT_CNT, h, pid_n, lut_sh, lut_sm, cnt_sh, start_n, Tq, Tk, window, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_LAYOUT: tl.constexpr):
    """Query tiles of a key tile, in three ranges: [m_lo, m_full) straddle the causal diagonal
    (masked), [m_full, m_win) see the whole key tile, [m_win, m_hi) straddle the window's far edge
    (masked; empty without a window). With a layout: lut[0:m_full], masked if causal."""
    lut = LUT
    m_end = tl.cdiv(Tq, BLOCK_M)
    m_win = m_end
    m_hi = m_end
    if HAS_LAYOUT:
        lut = LUT + h * lut_sh + pid_n * lut_sm
        m_lo = 0
        m_full = tl.load(LUT_CNT + h * cnt_sh + pid_n)
        m_win = 0
        m_hi = 0
    elif CAUSAL:  # the first query that sees key j is j - (Tk - Tq), the last j - (Tk - Tq) + window - 1
        m_lo = tl.maximum(start_n - (Tk - Tq), 0) // BLOCK_M
        m_full = tl.minimum(tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - (Tk - Tq), 0), BLOCK_M), m_end)
        m_hi = tl.minimum(tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - (Tk - Tq) + window, 0), BLOCK_M), m_end)
        m_win = tl.minimum(tl.maximum(tl.maximum(start_n - (Tk - Tq) + window, 0) // BLOCK_M, m_full), m_hi)
    else:
        m_lo = 0
        m_full = 0
    return lut, m_lo, m_full, m_win, m_hi


@triton.jit
def _listed_tile(lut, i, HAS_LAYOUT: tl.constexpr):
    """The i-th tile to visit: lut[i] with a block layout, else i itself."""
    if HAS_LAYOUT:
        return tl.load(lut + i)
    return i


@triton.jit
def _alibi_slope2(SLOPES, h, HAS_ALIBI: tl.constexpr):
    """Head h's ALiBi slope in base 2 (0 without ALiBi)."""
    if HAS_ALIBI:
        return tl.load(SLOPES + h) * _LOG2E
    return 0.0


@triton.jit
def _forget2(C, offs, T, HAS_FORGET: tl.constexpr):
    """FoX's cumulative log forget gates at offs, in base 2 (zeros without them: one return type)."""
    if HAS_FORGET:
        c = tl.load(C + offs, mask=offs < T, other=0.0) * _LOG2E
    else:
        c = tl.zeros(offs.shape, tl.float32)
    return c


# ----------------------------------------------------------------------------- forward

@triton.jit
def _score_tile(q, kt, offs_m, offs_n, Tk, diag, window, qk_scale, slope2, cq2, ck2, MASKED: tl.constexpr,
                CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_FORGET: tl.constexpr, DOT_PREC: tl.constexpr):
    """Base-2 scores of a query tile against a key tile, with ALiBi, FoX's gates and the masks:
    q [BLOCK_M, BLOCK_DQK], kt [BLOCK_DQK, BLOCK_N] -> [BLOCK_M, BLOCK_N] (-inf where hidden);
    cq2 [BLOCK_M], ck2 [BLOCK_N]: the cumulative log gates in base 2."""
    s = tl.dot(q, kt, input_precision=DOT_PREC) * qk_scale
    if HAS_ALIBI:
        s += slope2 * (offs_n[None, :] - (offs_m[:, None] + diag)).to(tl.float32)
    if HAS_FORGET:
        s += cq2[:, None] - ck2[None, :]
    if MASKED:
        visible = offs_n[None, :] < Tk
        if CAUSAL:  # and the window: key j within the last `window` positions of query i
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + diag)
            visible = visible & (offs_n[None, :] > offs_m[:, None] + diag - window)
        s = tl.where(visible, s, float("-inf"))
    return s


@triton.jit
def _fwd_tile(acc, m_i, l_i, q, K, V, CK, cq2, start_n, offs_m, offs_dqk, offs_dv, stride_kt, stride_kd,
              stride_vt, stride_vd, Tk, diag, window, qk_scale, slope2, DQK: tl.constexpr, DV: tl.constexpr,
              BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr,
              HAS_FORGET: tl.constexpr, DOT_PREC: tl.constexpr):
    """One step of the online softmax: fold the key tile at start_n into (acc, m_i, l_i)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kt = tl.load(K + offs_n[None, :] * stride_kt + offs_dqk[:, None] * stride_kd,
                 mask=(offs_n[None, :] < Tk) & (offs_dqk[:, None] < DQK), other=0.0)  # [BLOCK_DQK, BLOCK_N]
    ck2 = _forget2(CK, offs_n, Tk, HAS_FORGET)  # [BLOCK_N]
    s = _score_tile(q, kt, offs_m, offs_n, Tk, diag, window, qk_scale, slope2, cq2, ck2,
                    MASKED, CAUSAL, HAS_ALIBI, HAS_FORGET, DOT_PREC)  # [BLOCK_M, BLOCK_N], base-2 logits
    # running max; a row with nothing visible yet keeps m = -inf, so use 0 as its pivot
    m_new = tl.maximum(m_i, tl.max(s, 1))  # [BLOCK_M]
    m_pivot = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_pivot)  # rescales what was accumulated so far
    p = tl.exp2(s - m_pivot[:, None])  # [BLOCK_M, BLOCK_N]
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(V + offs_n[:, None] * stride_vt + offs_dv[None, :] * stride_vd,
                mask=(offs_n[:, None] < Tk) & (offs_dv[None, :] < DV), other=0.0)  # [BLOCK_N, BLOCK_DV]
    # the dot accumulates into the rescaled acc in place (no extra [BLOCK_M, BLOCK_DV] add)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PREC)
    return acc, m_new, l_i


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE, SLOPES, CQ, CK, LUT, LUT_CNT, lut_sh, lut_sm, cnt_sh,
                stride_qb, stride_qh, stride_qt, stride_qd, stride_kb, stride_kh, stride_kt, stride_kd,
                stride_vb, stride_vh, stride_vt, stride_vd, stride_ob, stride_oh, stride_ot, stride_od,
                H, GROUP, Tq, Tk, window, qk_scale,
                DQK: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr, CAUSAL: tl.constexpr,
                HAS_ALIBI: tl.constexpr, HAS_FORGET: tl.constexpr, HAS_LAYOUT: tl.constexpr, DOT_PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)  # int64 base offsets: B*H*T*D may exceed 2**31
    h = pid_bh % H
    hkv = (h // GROUP).to(tl.int64)  # GQA/MQA: the KV head of this query head
    Q += b * stride_qb + h.to(tl.int64) * stride_qh
    K += b * stride_kb + hkv * stride_kh
    V += b * stride_vb + hkv * stride_vh
    O += b * stride_ob + h.to(tl.int64) * stride_oh
    LSE += pid_bh.to(tl.int64) * Tq
    CQ += pid_bh.to(tl.int64) * Tq
    CK += pid_bh.to(tl.int64) * Tk

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_dqk = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    diag = Tk - Tq  # bottom-right alignment: query i sits at absolute position i + diag
    q = tl.load(Q + offs_m[:, None] * stride_qt + offs_dqk[None, :] * stride_qd,
                mask=(offs_m[:, None] < Tq) & (offs_dqk[None, :] < DQK), other=0.0)  # [BLOCK_M, BLOCK_DQK]
    slope2 = _alibi_slope2(SLOPES, h, HAS_ALIBI)
    cq2 = _forget2(CQ, offs_m, Tq, HAS_FORGET)  # [BLOCK_M]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max (base 2)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)  # unnormalised output

    lut, n_lo, n_mid, n_full, n_end = _key_tiles(LUT, LUT_CNT, h, pid_m, lut_sh, lut_sm, cnt_sh, start_m, Tq, Tk,
                                                 window, BLOCK_M, BLOCK_N, CAUSAL, HAS_LAYOUT)
    for nb in range(n_lo, n_mid):  # the window's far edge: masked
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, K, V, CK, cq2, nb * BLOCK_N, offs_m, offs_dqk, offs_dv,
                                  stride_kt, stride_kd, stride_vt, stride_vd, Tk, diag, window, qk_scale, slope2,
                                  DQK, DV, BLOCK_N, True, CAUSAL, HAS_ALIBI, HAS_FORGET, DOT_PREC)
    for nb in range(n_mid, n_full):  # inner tiles: no mask
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, K, V, CK, cq2, nb * BLOCK_N, offs_m, offs_dqk, offs_dv,
                                  stride_kt, stride_kd, stride_vt, stride_vd, Tk, diag, window, qk_scale, slope2,
                                  DQK, DV, BLOCK_N, False, CAUSAL, HAS_ALIBI, HAS_FORGET, DOT_PREC)
    for i in range(n_full, n_end):  # diagonal / ragged / block-sparse tiles: masked
        nb = _listed_tile(lut, i, HAS_LAYOUT)
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, K, V, CK, cq2, nb * BLOCK_N, offs_m, offs_dqk, offs_dv,
                                  stride_kt, stride_kd, stride_vt, stride_vd, Tk, diag, window, qk_scale, slope2,
                                  DQK, DV, BLOCK_N, True, CAUSAL, HAS_ALIBI, HAS_FORGET, DOT_PREC)

    # epilogue: normalise; rows that saw no key get o = 0 and lse = -inf
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * _LN2)  # natural log
    tl.store(O + offs_m[:, None] * stride_ot + offs_dv[None, :] * stride_od, o.to(O.dtype.element_ty),
             mask=(offs_m[:, None] < Tq) & (offs_dv[None, :] < DV))
    tl.store(LSE + offs_m, lse, mask=offs_m < Tq)


# ----------------------------------------------------------------------------- backward

@triton.jit
def _bwd_preprocess(O, DO, DELTA, stride_ob, stride_oh, stride_ot, stride_od,
                    stride_dob, stride_doh, stride_dot, stride_dod, H, Tq,
                    DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):
    """delta_i = sum_d dO[i, d] * O[i, d]  (= rowsum(P * dP), used by dS = P * (dP - delta))."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask = (offs_m[:, None] < Tq) & (offs_dv[None, :] < DV)
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot + offs_dv[None, :] * stride_od,
                mask=mask, other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_DV]
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dot + offs_dv[None, :] * stride_dod,
                 mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + pid_bh.to(tl.int64) * Tq + offs_m, tl.sum(o * do, 1), mask=offs_m < Tq)


@triton.jit
def _load_lse2(LSE, offs, T):
    """lse in base 2; rows out of range or with no visible key get +inf so that P = 0."""
    lse = tl.load(LSE + offs, mask=offs < T, other=float("inf")) * _LOG2E
    return tl.where(lse == float("-inf"), float("inf"), lse)


@triton.jit
def _dkdv_tile(dk, dv, dck, k, v, Q, DO, LSE, DELTA, CQ, ck2, start_m, offs_n, offs_dqk, offs_dv, stride_qt,
               stride_qd, stride_dot, stride_dod, Tq, diag, window, qk_scale, slope2, DQK: tl.constexpr,
               DV: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr, HAS_ALIBI: tl.constexpr,
               HAS_FORGET: tl.constexpr, DOT_PREC: tl.constexpr):
    """Add the contribution of the query tile at start_m to this key tile's dK and dV (and dc_k)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    qt = tl.load(Q + offs_m[None, :] * stride_qt + offs_dqk[:, None] * stride_qd,
                 mask=(offs_m[None, :] < Tq) & (offs_dqk[:, None] < DQK), other=0.0)  # [BLOCK_DQK, BLOCK_M]
    do = tl.load(DO + offs_m[:, None] * stride_dot + offs_dv[None, :] * stride_dod,
                 mask=(offs_m[:, None] < Tq) & (offs_dv[None, :] < DV), other=0.0)  # [BLOCK_M, BLOCK_DV]
    lse2 = _load_lse2(LSE, offs_m, Tq)  # [BLOCK_M]
    delta = tl.load(DELTA + offs_m, mask=offs_m < Tq, other=0.0)  # [BLOCK_M]
    # recompute P^T = exp2(S^T - lse)
    st = tl.dot(k, qt, input_precision=DOT_PREC) * qk_scale  # [BLOCK_N, BLOCK_M]
    if HAS_ALIBI:
        st += slope2 * (offs_n[:, None] - (offs_m[None, :] + diag)).to(tl.float32)
    if HAS_FORGET:  # c_q[i] - c_k[j], transposed
        st += _forget2(CQ, offs_m, Tq, HAS_FORGET)[None, :] - ck2[:, None]
    if MASKED:  # causal only (and the window): keys past Tk do not matter here (their rows are never stored)
        visible = (offs_n[:, None] <= offs_m[None, :] + diag) & (offs_n[:, None] > offs_m[None, :] + diag - window)
        st = tl.where(visible, st, float("-inf"))
    pt = tl.exp2(st - lse2[None, :])  # [BLOCK_N, BLOCK_M]
    dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=DOT_PREC)  # dV += P^T dO (accumulated in the dot)
    dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)  # dP^T = V dO^T  [BLOCK_N, BLOCK_M]
    dst = pt * (dpt - delta[None, :])  # dS^T = P^T * (dP^T - delta)
    dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk, input_precision=DOT_PREC)  # dK += dS^T Q
    if HAS_FORGET:  # the bias's gradient is dS itself; c_k enters it with a minus sign
        dck -= tl.sum(dst, 1)
    return dk, dv, dck


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, DK, DV_, LSE, DELTA, SLOPES, CQ, CK, DCK, LUT, LUT_CNT, lut_sh, lut_sm, cnt_sh,
                     stride_qb, stride_qh, stride_qt, stride_qd, stride_kb, stride_kh, stride_kt, stride_kd,
                     stride_vb, stride_vh, stride_vt, stride_vd, stride_dob, stride_doh, stride_dot, stride_dod,
                     stride_dkb, stride_dkh, stride_dkt, stride_dkd, stride_dvb, stride_dvh, stride_dvt, stride_dvd,
                     H, HKV, GROUP, Tq, Tk, window, sm_scale, qk_scale,
                     DQK: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr, CAUSAL: tl.constexpr,
                     HAS_ALIBI: tl.constexpr, HAS_FORGET: tl.constexpr, HAS_LAYOUT: tl.constexpr,
                     DOT_PREC: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)  # over batch * KV heads
    b = pid_bh // HKV
    hkv = pid_bh % HKV
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_dqk = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    diag = Tk - Tq
    mask_k = (offs_n[:, None] < Tk) & (offs_dqk[None, :] < DQK)
    mask_v = (offs_n[:, None] < Tk) & (offs_dv[None, :] < DV)
    k = tl.load(K + b.to(tl.int64) * stride_kb + hkv.to(tl.int64) * stride_kh + offs_n[:, None] * stride_kt
                + offs_dqk[None, :] * stride_kd, mask=mask_k, other=0.0)  # [BLOCK_N, BLOCK_DQK]
    v = tl.load(V + b.to(tl.int64) * stride_vb + hkv.to(tl.int64) * stride_vh + offs_n[:, None] * stride_vt
                + offs_dv[None, :] * stride_vd, mask=mask_v, other=0.0)  # [BLOCK_N, BLOCK_DV]
    dk = tl.zeros([BLOCK_N, BLOCK_DQK], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)

    for g in range(0, GROUP):  # the query heads that share this KV head: dK, dV sum over them
        h = hkv * GROUP + g
        Qh = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        DOh = DO + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
        LSEh = LSE + (b * H + h).to(tl.int64) * Tq
        DELTAh = DELTA + (b * H + h).to(tl.int64) * Tq
        slope2 = _alibi_slope2(SLOPES, h, HAS_ALIBI)
        CQh = CQ + (b * H + h).to(tl.int64) * Tq
        ck2 = _forget2(CK + (b * H + h).to(tl.int64) * Tk, offs_n, Tk, HAS_FORGET)  # [BLOCK_N]
        dck = tl.zeros([BLOCK_N], tl.float32)  # c_k is per query head: its gradient too
        lut, m_lo, m_full, m_win, m_hi = _query_tiles(LUT, LUT_CNT, h, pid_n, lut_sh, lut_sm, cnt_sh, start_n,
                                                      Tq, Tk, window, BLOCK_M, BLOCK_N, CAUSAL, HAS_LAYOUT)
        for i in range(m_lo, m_full):  # diagonal / block-sparse tiles: causal mask
            mb = _listed_tile(lut, i, HAS_LAYOUT)
            dk, dv, dck = _dkdv_tile(dk, dv, dck, k, v, Qh, DOh, LSEh, DELTAh, CQh, ck2, mb * BLOCK_M, offs_n,
                                     offs_dqk, offs_dv, stride_qt, stride_qd, stride_dot, stride_dod, Tq, diag,
                                     window, qk_scale, slope2, DQK, DV, BLOCK_M, CAUSAL, HAS_ALIBI, HAS_FORGET,
                                     DOT_PREC)
        for mb in range(m_full, m_win):  # tiles below the diagonal (all, when not causal): no mask
            dk, dv, dck = _dkdv_tile(dk, dv, dck, k, v, Qh, DOh, LSEh, DELTAh, CQh, ck2, mb * BLOCK_M, offs_n,
                                     offs_dqk, offs_dv, stride_qt, stride_qd, stride_dot, stride_dod, Tq, diag,
                                     window, qk_scale, slope2, DQK, DV, BLOCK_M, False, HAS_ALIBI, HAS_FORGET, DOT_PREC)
        for mb in range(m_win, m_hi):  # the window's far edge: masked
            dk, dv, dck = _dkdv_tile(dk, dv, dck, k, v, Qh, DOh, LSEh, DELTAh, CQh, ck2, mb * BLOCK_M, offs_n,
                                     offs_dqk, offs_dv, stride_qt, stride_qd, stride_dot, stride_dod, Tq, diag,
                                     window, qk_scale, slope2, DQK, DV, BLOCK_M, True, HAS_ALIBI, HAS_FORGET, DOT_PREC)

        if HAS_FORGET:
            tl.store(DCK + (b * H + h).to(tl.int64) * Tk + offs_n, dck, mask=offs_n < Tk)

    tl.store(DK + b.to(tl.int64) * stride_dkb + hkv.to(tl.int64) * stride_dkh + offs_n[:, None] * stride_dkt
             + offs_dqk[None, :] * stride_dkd, (dk * sm_scale).to(DK.dtype.element_ty), mask=mask_k)
    tl.store(DV_ + b.to(tl.int64) * stride_dvb + hkv.to(tl.int64) * stride_dvh + offs_n[:, None] * stride_dvt
             + offs_dv[None, :] * stride_dvd, dv.to(DV_.dtype.element_ty), mask=mask_v)


@triton.jit
def _dq_tile(dq, dcq, q, do, lse2, delta, K, V, CK, cq2, start_n, offs_m, offs_dqk, offs_dv, stride_kt, stride_kd,
             stride_vt, stride_vd, Tk, diag, window, qk_scale, slope2, DQK: tl.constexpr, DV: tl.constexpr,
             BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr,
             HAS_FORGET: tl.constexpr, DOT_PREC: tl.constexpr):
    """Add the contribution of the key tile at start_n to this query tile's dQ (and dc_q)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kt = tl.load(K + offs_n[None, :] * stride_kt + offs_dqk[:, None] * stride_kd,
                 mask=(offs_n[None, :] < Tk) & (offs_dqk[:, None] < DQK), other=0.0)  # [BLOCK_DQK, BLOCK_N]
    vt = tl.load(V + offs_n[None, :] * stride_vt + offs_dv[:, None] * stride_vd,
                 mask=(offs_n[None, :] < Tk) & (offs_dv[:, None] < DV), other=0.0)  # [BLOCK_DV, BLOCK_N]
    ck2 = _forget2(CK, offs_n, Tk, HAS_FORGET)  # [BLOCK_N]
    s = _score_tile(q, kt, offs_m, offs_n, Tk, diag, window, qk_scale, slope2, cq2, ck2,
                    MASKED, CAUSAL, HAS_ALIBI, HAS_FORGET, DOT_PREC)  # [BLOCK_M, BLOCK_N]
    p = tl.exp2(s - lse2[:, None])
    dp = tl.dot(do, vt, input_precision=DOT_PREC)  # dP = dO V^T  [BLOCK_M, BLOCK_N]
    ds = p * (dp - delta[:, None])
    if HAS_FORGET:  # the bias's gradient is dS itself
        dcq += tl.sum(ds, 1)
    return tl.dot(ds.to(kt.dtype), tl.trans(kt), dq, input_precision=DOT_PREC), dcq  # dQ += dS K


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, DQ, LSE, DELTA, SLOPES, CQ, CK, DCQ, LUT, LUT_CNT, lut_sh, lut_sm, cnt_sh,
                   stride_qb, stride_qh, stride_qt, stride_qd, stride_kb, stride_kh, stride_kt, stride_kd,
                   stride_vb, stride_vh, stride_vt, stride_vd, stride_dob, stride_doh, stride_dot, stride_dod,
                   stride_dqb, stride_dqh, stride_dqt, stride_dqd,
                   H, GROUP, Tq, Tk, window, sm_scale, qk_scale,
                   DQK: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr, CAUSAL: tl.constexpr,
                   HAS_ALIBI: tl.constexpr, HAS_FORGET: tl.constexpr, HAS_LAYOUT: tl.constexpr,
                   DOT_PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    hkv = (h // GROUP).to(tl.int64)
    K += b * stride_kb + hkv * stride_kh
    V += b * stride_vb + hkv * stride_vh
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_dqk = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    diag = Tk - Tq
    mask_q = (offs_m[:, None] < Tq) & (offs_dqk[None, :] < DQK)
    q = tl.load(Q + b * stride_qb + h.to(tl.int64) * stride_qh + offs_m[:, None] * stride_qt
                + offs_dqk[None, :] * stride_qd, mask=mask_q, other=0.0)  # [BLOCK_M, BLOCK_DQK]
    do = tl.load(DO + b * stride_dob + h.to(tl.int64) * stride_doh + offs_m[:, None] * stride_dot
                 + offs_dv[None, :] * stride_dod, mask=(offs_m[:, None] < Tq) & (offs_dv[None, :] < DV),
                 other=0.0)  # [BLOCK_M, BLOCK_DV]
    lse2 = _load_lse2(LSE + pid_bh.to(tl.int64) * Tq, offs_m, Tq)  # [BLOCK_M]
    delta = tl.load(DELTA + pid_bh.to(tl.int64) * Tq + offs_m, mask=offs_m < Tq, other=0.0)  # [BLOCK_M]
    slope2 = _alibi_slope2(SLOPES, h, HAS_ALIBI)
    cq2 = _forget2(CQ + pid_bh.to(tl.int64) * Tq, offs_m, Tq, HAS_FORGET)  # [BLOCK_M]
    CK += pid_bh.to(tl.int64) * Tk
    dq = tl.zeros([BLOCK_M, BLOCK_DQK], tl.float32)
    dcq = tl.zeros([BLOCK_M], tl.float32)

    lut, n_lo, n_mid, n_full, n_end = _key_tiles(LUT, LUT_CNT, h, pid_m, lut_sh, lut_sm, cnt_sh, start_m, Tq, Tk,
                                                 window, BLOCK_M, BLOCK_N, CAUSAL, HAS_LAYOUT)  # as the forward
    for nb in range(n_lo, n_mid):
        dq, dcq = _dq_tile(dq, dcq, q, do, lse2, delta, K, V, CK, cq2, nb * BLOCK_N, offs_m, offs_dqk, offs_dv,
                           stride_kt, stride_kd, stride_vt, stride_vd, Tk, diag, window, qk_scale, slope2,
                           DQK, DV, BLOCK_N, True, CAUSAL, HAS_ALIBI, HAS_FORGET, DOT_PREC)
    for nb in range(n_mid, n_full):
        dq, dcq = _dq_tile(dq, dcq, q, do, lse2, delta, K, V, CK, cq2, nb * BLOCK_N, offs_m, offs_dqk, offs_dv,
                           stride_kt, stride_kd, stride_vt, stride_vd, Tk, diag, window, qk_scale, slope2,
                           DQK, DV, BLOCK_N, False, CAUSAL, HAS_ALIBI, HAS_FORGET, DOT_PREC)
    for i in range(n_full, n_end):
        nb = _listed_tile(lut, i, HAS_LAYOUT)
        dq, dcq = _dq_tile(dq, dcq, q, do, lse2, delta, K, V, CK, cq2, nb * BLOCK_N, offs_m, offs_dqk, offs_dv,
                           stride_kt, stride_kd, stride_vt, stride_vd, Tk, diag, window, qk_scale, slope2,
                           DQK, DV, BLOCK_N, True, CAUSAL, HAS_ALIBI, HAS_FORGET, DOT_PREC)

    tl.store(DQ + b * stride_dqb + h.to(tl.int64) * stride_dqh + offs_m[:, None] * stride_dqt
             + offs_dqk[None, :] * stride_dqd, (dq * sm_scale).to(DQ.dtype.element_ty), mask=mask_q)
    if HAS_FORGET:
        tl.store(DCQ + pid_bh.to(tl.int64) * Tq + offs_m, dcq, mask=offs_m < Tq)



# ----------------------------------------------------------------------------- launch

# Candidate (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel and padded head dim (fp16/bf16,
# Hopper-class). dkdv: BLOCK_N keys per program, BLOCK_M queries per inner step; fwd/dq: the
# reverse. The first of each list was chosen so that sm_90 builds neither spill registers nor
# overflow shared memory; the others are what the timing in _launch may prefer on a given GPU.
_GPU_CONFIGS = {
    "fwd": {64: [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 4)],
            128: [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3)],
            256: [(64, 32, 8, 2), (64, 64, 8, 2), (32, 32, 4, 2)]},
    "dkdv": {64: [(32, 128, 8, 3), (64, 128, 8, 3), (32, 64, 4, 3)],
             128: [(32, 64, 8, 2), (16, 64, 8, 2)],  # larger tiles or 3 stages spill at d=128
             256: [(32, 32, 8, 2), (16, 32, 8, 2)]},
    "dq": {64: [(128, 32, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3)],
           128: [(128, 32, 8, 3), (128, 64, 8, 3), (64, 32, 4, 3)],
           256: [(64, 32, 8, 2), (32, 32, 4, 2)]},
}
_INTERPRET_CONFIGS = {"fwd": (32, 16, 4, 1), "dkdv": (16, 32, 4, 1), "dq": (32, 16, 4, 1)}
_CHOSEN = {}  # case -> the config _launch settled on (see tuned_configs)


def _candidates(kind, dmax, dtype, layout_bs):
    """(configs worth timing, smaller fallbacks in case none of them fits in shared memory)."""
    if interpreted():
        cands = [_INTERPRET_CONFIGS[kind]]
    elif dtype == torch.float32:  # exact fp32 dots run on FMA units: small tiles (tests, not speed)
        cands = [(32, 32, 4, 2) if dmax <= 128 else (16, 16, 4, 2)]
    else:
        cands = list(_GPU_CONFIGS[kind][max(64, dmax)])
    if layout_bs is not None:  # the layout fixes the tiles; only warps and stages can change
        cands = [(layout_bs, layout_bs, w, s) for _, _, w, s in cands]
    bm, bn, w, _ = cands[0]
    fallbacks = [(bm, bn, w, 1)]
    if layout_bs is None:
        fallbacks += [(max(16, bm // 2), max(16, bn // 2), w, 1), (16, 16, 4, 1)]
    return cands, [c for c in dict.fromkeys(fallbacks) if c not in cands]


def _pick_config(cands, run, timer):
    """The fastest of `cands` under `timer(lambda: run(cfg))`, skipping those that do not fit
    (OutOfResources). With timer None: the first that fits (no timing)."""
    best, best_t = None, float("inf")
    for cfg in cands:
        try:
            t = timer(lambda: run(cfg)) if timer is not None else run(cfg)
        except OutOfResources:
            continue
        if timer is None:
            return cfg
        if t < best_t:
            best, best_t = cfg, t
    if best is None:
        raise OutOfResources(0, 0, "shared memory")  # not even the smallest tile fits
    return best


def _median_time(fn, device, reps=5):
    """Median seconds of fn() after one warm-up (which compiles)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times)[reps // 2]


def _launch(kernel, kind, grid, args, dmax, dtype, layout_bs, case, **meta):
    """Run `kernel` with the config chosen for this case. Where there are several candidates
    (fp16/bf16 on a GPU), the first call of a case times each one that fits and keeps the
    fastest, like triton.autotune (these kernels only write their outputs, so running them
    again is harmless); FLASH_ATTN_AUTOTUNE=0 takes the first that fits, for runs that must
    repeat bit for bit across processes."""
    key = (kind, dmax, dtype, layout_bs, case, tuple(sorted(meta.items())))

    def run(cfg):
        bm, bn, warps, stages = cfg
        kernel[grid(bm, bn)](*args, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, **meta)

    if key not in _CHOSEN:
        preferred, fallbacks = _candidates(kind, dmax, dtype, layout_bs)
        tune = len(preferred) > 1 and os.environ.get("FLASH_ATTN_AUTOTUNE", "1") != "0"
        device = args[0].device
        _CHOSEN[key] = _pick_config(preferred + fallbacks, run, (lambda fn: _median_time(fn, device)) if tune else None)
        if tune:
            run(_CHOSEN[key])  # the outputs of the chosen config, whatever ran last
        return
    run(_CHOSEN[key])


def tuned_configs():
    """{case: (BLOCK_M, BLOCK_N, num_warps, num_stages)} chosen so far, for benchmarks."""
    out = {}
    for (kind, _, dtype, layout_bs, (bh, tq, tk), meta), cfg in _CHOSEN.items():
        m = dict(meta)
        flags = [f for f, on in (("causal", m["CAUSAL"]), ("alibi", m["HAS_ALIBI"]), ("forget", m["HAS_FORGET"]),
                                 ("layout", layout_bs)) if on]
        out[f"{kind} {str(dtype)[6:]} d={m['DQK']}/{m['DV']} B*H~{bh} Tq~{tq} Tk~{tk} {' '.join(flags)}".strip()] = cfg
    return out


def _layout_lists(block_layout, H, Tq, Tk, bs, causal, device):
    """Block layout -> (lut, cnt, lut_t, cnt_t): per query block the key blocks to visit, padded
    int32 (Hl, nq, nk) + counts (Hl, nq), and the transpose for the dK/dV kernel. Hl is 1 or H."""
    nq, nk = triton.cdiv(Tq, bs), triton.cdiv(Tk, bs)
    lay = block_layout.to(device=device, dtype=torch.bool)
    lay = lay[None] if lay.dim() == 2 else lay
    if lay.dim() != 3 or lay.shape[0] not in (1, H) or lay.shape[1] < nq or lay.shape[2] < nk:
        raise ValueError(f"block_layout must be (n_q_blocks>={nq}, n_k_blocks>={nk}) or (H={H}, ..) at "
                         f"block_size={bs}; got {tuple(block_layout.shape)}")
    lay = lay[:, :nq, :nk]
    if causal:  # skip blocks no query of the block can see
        last_q = torch.clamp(torch.arange(nq, device=device) * bs + bs - 1, max=Tq - 1)
        first_k = torch.arange(nk, device=device) * bs
        lay = lay & (first_k[None, :] <= last_q[:, None] + Tk - Tq)[None]

    def lists(x):  # visited indices first, in ascending order (stable sort)
        lut = torch.sort((~x).to(torch.uint8), dim=-1, stable=True).indices
        return lut.to(torch.int32).contiguous(), x.sum(-1, dtype=torch.int32).contiguous()
    return (*lists(lay), *lists(lay.transpose(1, 2)))


def _lut_args(lists, transposed, dummy):
    """Kernel arguments (LUT, LUT_CNT, lut_sh, lut_sm, cnt_sh); placeholders when dense."""
    if lists is None:
        return dummy, dummy, 0, 0, 0
    lut, cnt = lists[2:] if transposed else lists[:2]
    shared = lut.shape[0] == 1  # one layout for all heads
    return lut, cnt, 0 if shared else lut.stride(0), lut.stride(1), 0 if shared else cnt.stride(0)


def _meta(q, v, causal, alibi, lists, forget):
    return dict(DQK=q.shape[-1], DV=v.shape[-1], BLOCK_DQK=max(16, triton.next_power_of_2(q.shape[-1])),
                BLOCK_DV=max(16, triton.next_power_of_2(v.shape[-1])), CAUSAL=causal,
                HAS_ALIBI=alibi is not None, HAS_FORGET=forget is not None, HAS_LAYOUT=lists is not None,
                DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32")  # fp32: no TF32 rounding


def _case(q, k):
    """What the best tile depends on besides the head dims: the sizes, rounded to powers of two."""
    p2 = triton.next_power_of_2
    return p2(q.shape[0] * q.shape[1]), p2(q.shape[2]), p2(k.shape[2])


def _flash_fwd(q, k, v, causal, sm_scale, alibi, lists, bs, window, forget):
    B, H, Tq, _ = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[-1]
    o = torch.empty((B, H, Tq, Dv), device=q.device, dtype=q.dtype)
    lse = torch.empty((B, H, Tq), device=q.device, dtype=torch.float32)
    meta = _meta(q, v, causal, alibi, lists, forget)
    cq, ck = forget if forget is not None else (q, q)   # placeholders without FoX's gates
    args = (q, k, v, o, lse, alibi if alibi is not None else q, cq, ck, *_lut_args(lists, False, q),
            *q.stride(), *k.stride(), *v.stride(), *o.stride(), H, H // Hkv, Tq, Tk, window, sm_scale * LOG2E)
    _launch(_fwd_kernel, "fwd", lambda bm, bn: (triton.cdiv(Tq, bm), B * H), args,
            max(meta["BLOCK_DQK"], meta["BLOCK_DV"]), q.dtype, bs if lists is not None else None, _case(q, k),
            **meta)
    return o, lse


def _flash_bwd(do, q, k, v, o, lse, causal, sm_scale, alibi, lists, bs, window, forget):
    B, H, Tq, _ = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[-1]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    meta = _meta(q, v, causal, alibi, lists, forget)
    cq, ck = forget if forget is not None else (q, q)
    dcq, dck = (torch.zeros_like(cq), torch.zeros_like(ck)) if forget is not None else (q, q)
    dmax, layout_bs = max(meta["BLOCK_DQK"], meta["BLOCK_DV"]), bs if lists is not None else None
    # 1. delta = rowsum(dO * O)
    delta = torch.empty((B, H, Tq), device=q.device, dtype=torch.float32)
    _bwd_preprocess[(triton.cdiv(Tq, 64), B * H)](o, do, delta, *o.stride(), *do.stride(), H, Tq, DV=Dv,
                                                   BLOCK_M=64, BLOCK_DV=meta["BLOCK_DV"])
    slopes = alibi if alibi is not None else q
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    # 2. dK, dV: one program per key tile and KV head
    args = (q, k, v, do, dk, dv, lse, delta, slopes, cq, ck, dck, *_lut_args(lists, True, q), *strides, *dk.stride(),
            *dv.stride(), H, Hkv, H // Hkv, Tq, Tk, window, sm_scale, sm_scale * LOG2E)
    _launch(_bwd_dkdv_kernel, "dkdv", lambda bm, bn: (triton.cdiv(Tk, bn), B * Hkv), args, dmax, q.dtype,
            layout_bs, _case(q, k), **meta)
    # 3. dQ: one program per query tile and query head
    args = (q, k, v, do, dq, lse, delta, slopes, cq, ck, dcq, *_lut_args(lists, False, q), *strides, *dq.stride(),
            H, H // Hkv, Tq, Tk, window, sm_scale, sm_scale * LOG2E)
    _launch(_bwd_dq_kernel, "dq", lambda bm, bn: (triton.cdiv(Tq, bm), B * H), args, dmax, q.dtype,
            layout_bs, _case(q, k), **meta)
    return dq, dk, dv, *((dcq, dck) if forget is not None else (None, None))


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, alibi, lists, bs, window, cq, ck):
        forget = None if cq is None else (cq, ck)
        o, lse = _flash_fwd(q, k, v, causal, sm_scale, alibi, lists, bs, window, forget)
        ctx.save_for_backward(q, k, v, o, lse, *(forget or ()))
        ctx.args = (causal, sm_scale, alibi, lists, bs, window)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse, *forget = ctx.saved_tensors
        dq, dk, dv, dcq, dck = _flash_bwd(do, q, k, v, o, lse, *ctx.args, tuple(forget) or None)
        return dq, dk, dv, None, None, None, None, None, None, dcq, dck


@torch.compiler.disable
def flash_attention(q, k, v, causal=True, softmax_scale=None, alibi_slopes=None, block_layout=None,
                    *, block_size=64, window=None, forget=None, return_lse=False):
    """FlashAttention-2 (see the module docstring). Returns o (B, H, Tq, Dv) in q's dtype, or
    (o, lse) with lse (B, H, Tq) fp32 in natural log when return_lse. Differentiable in q, k, v
    (and forget's two tensors: FoX's cumulative log gates (B, H, Tq) and (B, H, Tk), bias c_q[i] - c_k[j]).
    softmax_scale defaults to 1/sqrt(Dqk); block_size is the granularity of block_layout;
    window W (causal only): each query sees only the keys of its last W positions."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be (batch, heads, time, dim)")
    B, H, Tq, Dqk = q.shape
    if k.shape[:3] != v.shape[:3] or k.shape[0] != B or k.shape[-1] != Dqk or H % k.shape[1]:
        raise ValueError(f"incompatible shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v must share one of fp16/bf16/fp32; got {q.dtype}, {k.dtype}, {v.dtype}")
    why_not = supports(Dqk, v.shape[-1], layout_block=block_size if block_layout is not None else None)
    if why_not:
        raise ValueError(why_not)
    if not q.device == k.device == v.device:
        raise ValueError("q, k, v must be on the same device")
    if B * H > 65535:  # batch * heads is grid axis 1
        raise ValueError(f"batch * heads = {B * H} exceeds 65535")
    if q.device.type == "cpu" and not interpreted():
        raise RuntimeError("flash_attention on CPU tensors needs the Triton interpreter: set TRITON_INTERPRET=1 "
                           "before importing attn_kernels.flash_attn, or use attn_impl=sdpa")
    sm_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(Dqk)
    alibi = None
    if alibi_slopes is not None:
        alibi = alibi_slopes.to(device=q.device, dtype=torch.float32).contiguous()
        if alibi.shape != (H,):
            raise ValueError(f"alibi_slopes must be ({H},); got {tuple(alibi_slopes.shape)}")
    if window is not None and (not causal or block_layout is not None or int(window) < 1):
        raise ValueError(f"window={window} needs causal=True, no block_layout and a value >= 1")
    # no window: one longer than any query-key distance, so the same masks and tile ranges serve
    win = int(window) if window is not None else Tq + k.shape[2] + 1
    lists = None
    if block_layout is not None:
        lists = _layout_lists(block_layout, H, Tq, Tk=k.shape[2], bs=block_size, causal=causal, device=q.device)
    cq, ck = (None, None) if forget is None else (t.float().contiguous() for t in forget)
    if forget is not None and (cq.shape != (B, H, Tq) or ck.shape != (B, H, k.shape[2])):
        raise ValueError(f"forget must be (c_q ({B}, {H}, {Tq}), c_k ({B}, {H}, {k.shape[2]})); "
                         f"got {tuple(cq.shape)}, {tuple(ck.shape)}")
    o, lse = _FlashAttention.apply(q, k, v, bool(causal), float(sm_scale), alibi, lists, block_size, win, cq, ck)
    return (o, lse) if return_lse else o
