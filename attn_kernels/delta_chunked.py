"""The delta rule (DeltaNet) and its gated form (Gated DeltaNet) in chunked PyTorch.

The recurrence, per head, with S the (Dk, Dv) state, k_t L2-normalised, beta_t in (0, 1) the
write strength and g_t <= 0 the log-decay (alpha_t = exp(g_t); g None: DeltaNet, alpha = 1):

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T        o_t = scale * q_t S_t

Read as a write that corrects: S_t = alpha_t S_{t-1} + k_t u_t^T with the new value
u_t = beta_t (v_t - alpha_t S_{t-1}^T k_t), what k_t should read minus what it reads now.

Two computations of it (the third, the loop both are tested against, is
attn_kernels.reference.naive_recurrent_delta_rule):
    chunk_delta_rule        the chunked parallel form (WY / UT transform): training and prefill
    recurrent_delta_step    one token against the state: decoding
All compute in fp32 whatever autocast says. Needs only PyTorch: no Triton kernel here (the
chunk's triangular solve is a sequential step a simple kernel would not speed up on CPU);
attention/dispatch.py records that PyTorch runs.
"""
import torch

from attn_kernels.gla_chunked import first_tokens, fp32, in_dtype, in_fp32, time_chunks


@in_fp32
def recurrent_delta_step(q, k, v, beta, g, state, scale=None):
    """One decoding step: q, k (B, H, 1, Dk); v (B, H, 1, Dv); beta, g (B, H, 1) (g None: no decay);
    state (B, H, Dk, Dv) fp32. Returns o (B, H, 1, Dv) and the next state. Each head's rows are
    (1, D) matrices, so each product is one bmm over the B*H heads (no einsum's reshapes)."""
    B, H, _, Dk = q.shape
    Dv = v.size(-1)
    scale = Dk ** -0.5 if scale is None else scale
    S, k = state.reshape(B * H, Dk, Dv), fp32(k).reshape(B * H, 1, Dk)
    if g is not None:                                                  # forget
        S = fp32(g).exp().reshape(B * H, 1, 1) * S
    u = (fp32(v).reshape(B * H, 1, Dv) - torch.bmm(k, S)).mul_(fp32(beta).reshape(B * H, 1, 1))  # the correction
    S = torch.addcmul(S, k.transpose(1, 2), u)                        # write: k u^T
    o = torch.bmm(fp32(q).reshape(B * H, 1, Dk), S).mul_(scale)       # in place: no wrapped scalar
    return in_dtype(o.view(B, H, 1, Dv), q.dtype), S.view(B, H, Dk, Dv)


SOLVE_BLOCK = 16  # unit_lower_inverse solves blocks of this size and merges them by matmuls


def unit_lower_inverse(A):
    """(I + A)^-1 for A (..., n, n) strictly lower triangular (only that part is read), by halves:

        [ X  0 ]^-1   [  X^-1          0   ]       X, Z: the diagonal halves (unit lower);
        [ Y  Z ]    = [ -Z^-1 Y X^-1  Z^-1 ]       Y: the block below the diagonal

    down to SOLVE_BLOCK rows, where one batched triangular solve inverts both halves of every
    level at once. Exact algebra (no series), as stable as the solve; on a CPU several times faster
    than one solve of the whole (n, n), whose batched small solves run far below matmul speed."""
    n = A.size(-1)
    eye = torch.eye(n, dtype=A.dtype, device=A.device)
    if n <= SOLVE_BLOCK or n % 2:
        return torch.linalg.solve_triangular(A + eye, eye.expand_as(A), upper=False, unitriangular=True)
    h = n // 2
    halves = unit_lower_inverse(torch.stack([A[..., :h, :h], A[..., h:, h:]]))     # (2, ..., h, h)
    X_inv, Z_inv = halves[0], halves[1]
    low = -(Z_inv @ A[..., h:, :h] @ X_inv)                                         # (..., h, h)
    return torch.cat([torch.cat([X_inv, torch.zeros_like(X_inv)], dim=-1),
                      torch.cat([low, Z_inv], dim=-1)], dim=-2)


class UnitLowerInverse(torch.autograd.Function):
    """(I + strictly_lower(A))^-1 with its backward written out: only A's strictly lower part is read
    (the diagonal and above may hold anything), and with M = I + A, d(M^-1) = -M^-1 dM M^-1 gives

        dA = strictly_lower( -T^T dT T^T )          T = M^-1

    two products, where autograd through unit_lower_inverse's halves would replay the triangular
    solve, every slice, cat and stack."""

    @staticmethod
    def forward(ctx, A):
        T = unit_lower_inverse(A)
        ctx.save_for_backward(T)
        return T

    @staticmethod
    def backward(ctx, dT):
        T, = ctx.saved_tensors
        Tt = T.transpose(-1, -2)
        return torch.tril(-(Tt @ (dT @ Tt)), diagonal=-1)


@in_fp32
def chunk_delta_rule(q, k, v, beta, g=None, scale=None, initial_state=None, output_final_state=False,
                     chunk_size=64):
    """The chunked form (Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule
    over Sequence Length"; the gate as in Gated DeltaNet): same results as the naive loop;
    differentiable by autograd in q, k, v, beta, g and initial_state.
    q, k (B, H, T, Dk); v (B, H, T, Dv); beta, g (B, H, T); state (B, H, Dk, Dv) fp32.
    Returns o (B, H, T, Dv) in q's dtype and the final state (or None).

    Time is cut into chunks of C tokens (the tail zero-padded: k = v = beta = g = 0 there changes
    neither outputs nor state). Within a chunk, with S the state at its start, b_i = g_0 + .. + g_i
    the cumulative log-decay (b <= 0) and Gamma_ij = exp(b_i - b_j) for j <= i (<= 1: stable):

        Step 1  A = diag(beta) (K K^T * Gamma), strictly lower         (C, C)
        Step 2  T = (I + A)^-1 diag(beta)      (UT transform: unit_lower_inverse, by halves)
                W = T diag(exp(b)) K,  U = T V                          (C, Dk), (C, Dv)
        Step 3  U' = U - W S                   (the chunk's corrected values u_i, all at once)
        Step 4  O = scale [ diag(exp(b)) Q S + (Q K^T * Gamma, lower with diagonal) U' ]
                S <- exp(b_last) S + (K * exp(b_last - b))^T U'
    Steps 1-2 and the intra-chunk scores are batched over all chunks; steps 3-4 pass the state
    from chunk to chunk (T / C small sequential steps).
    """
    B, H, T, Dk = q.shape
    Dv = v.size(-1)
    scale = Dk ** -0.5 if scale is None else scale
    C = chunk_size
    N = (T + C - 1) // C  # chunks; time_chunks zero-pads the last

    # contiguous once: q, k, v often arrive as transposed views, and every batched product over chunks
    # (and each chunk slice of the state pass) would otherwise copy its operand again
    qc, kc, vc = (time_chunks(t, C).contiguous() for t in (q, k, v))
    qc, bc = qc * scale, time_chunks(beta, C)
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    if g is None:
        gamma = lower.float()                                            # (C, C): 1 on and below the diagonal
        decay_in = decay_out = None
    else:
        b = time_chunks(g, C).cumsum(dim=-1)                             # (B, H, N, C)
        gamma = (b[..., :, None] - b[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # (B,H,N,C,C)
        decay_in = b.exp()[..., None]                                    # exp(b_i) (B, H, N, C, 1)
        decay_out = (b[..., -1:] - b).exp()[..., None]                   # exp(b_last - b_i)

    # Steps 1-2: the UT transform of every chunk at once (UnitLowerInverse reads A's strictly lower part,
    # so without a decay A needs no mask)
    A = (kc @ kc.transpose(-1, -2)) * bc[..., None]                      # (B, H, N, C, C)
    A = A if g is None else A * gamma
    T_ut = UnitLowerInverse.apply(A) * bc[..., None, :]                 # (B, H, N, C, C)
    W = T_ut @ (kc if decay_in is None else kc * decay_in)               # (B, H, N, C, Dk)
    U = T_ut @ vc                                                        # (B, H, N, C, Dv)
    scores = (qc @ kc.transpose(-1, -2)) * gamma                         # (B, H, N, C, C), lower
    q_in = qc if decay_in is None else qc * decay_in
    k_out = kc if decay_out is None else kc * decay_out

    # Steps 3-4: chunk by chunk
    S0 = q.new_zeros(B, H, Dk, Dv, dtype=torch.float32) if initial_state is None else initial_state.float()
    lasts = None if g is None else b[..., -1].exp()                      # exp(b_last) per chunk (B, H, N)
    o, S = StatePass.apply(U, W, q_in, scores, k_out, lasts, S0)
    o = first_tokens(o.view(B, H, N * C, Dv), T)
    return o.to(q.dtype), (S if output_final_state else None)


class StatePass(torch.autograd.Function):
    """Steps 3-4 of chunk_delta_rule, with the backward written out. Only the state recurrence is
    sequential; every other product is batched over the N chunks, forward and backward:

        forward   u_n = U_n - W_n S_n              S_{n+1} = last_n S_n + K_n^T u_n   (n = 0 .. N-1)
                  O = Q S_in + scores u            (all chunks at once; S_in: the states entering them)
        backward  G_N = dS_N;  for n = N-1 .. 0:   du_n = scores_n^T dO_n + K_n G_{n+1}
                                                   G_n  = Q_n^T dO_n + last_n G_{n+1} - W_n^T du_n
                  dU = du,  dW = -du S_in^T,  dQ = dO S_in^T,  dscores = dO u^T,
                  dK = u G_out^T,  dlast_n = <G_{n+1}, S_n>,  dS_0 = G_0

    Autograd through the loop would record four products per chunk and replay eight; here the loop
    holds two products each way, and the rest are one batched product per tensor.
    U (B, H, N, C, Dv), W, Q, K (B, H, N, C, Dk), scores (B, H, N, C, C), lasts (B, H, N) or None,
    S0 (B, H, Dk, Dv). Returns O (B, H, N, C, Dv) and the final state."""

    @staticmethod
    def forward(ctx, U, W, Q, scores, K, lasts, S0):
        B, H, N, C, Dv = U.shape
        S = S0.reshape(B * H, *S0.shape[2:])                                  # (BH, Dk, Dv)
        entering, corrected = [], []
        # (BH, C, D) each; K's chunks as (BH, Dk, C) transposed views: one transpose, not one per chunk
        for U_n, W_n, Kt_n, last in zip(*chunk_slices(U, W, K.transpose(-1, -2)), chunk_scales(lasts, N)):
            entering.append(S)
            u_n = torch.baddbmm(U_n, W_n, S, alpha=-1)                         # U_n - W_n S: one op, no reshapes
            corrected.append(u_n)
            S = torch.baddbmm(S if last is None else last * S, Kt_n, u_n)
        S_in, u = torch.stack(entering, dim=1), torch.stack(corrected, dim=1)   # (BH, N, Dk, Dv), (BH, N, C, Dv)
        ctx.save_for_backward(W, Q, scores, K, lasts, S_in, u)
        O = torch.baddbmm(torch.bmm(chunks_flat(scores), chunks_flat(u)), chunks_flat(Q), chunks_flat(S_in))
        return O.view(B, H, N, C, Dv), S.view(B, H, *S.shape[1:])

    @staticmethod
    def backward(ctx, dO, dS):
        W, Q, scores, K, lasts, S_in, u = ctx.saved_tensors
        B, H, N, C, Dv = dO.shape
        Dk = Q.size(-1)
        dO = chunks_flat(dO.contiguous())                                     # (BHN, C, Dv)
        du_direct = torch.bmm(chunks_flat(scores).transpose(1, 2), dO).view(B * H, N, C, Dv)
        dS_direct = torch.bmm(chunks_flat(Q).transpose(1, 2), dO).view(B * H, N, Dk, Dv)
        G = dS.reshape(B * H, Dk, Dv)               # autograd materialises it (zeros when S is unused)
        Wt_n, K_n, du_direct, dS_direct = chunk_slices(W.transpose(-1, -2), K, du_direct, dS_direct)
        lasts_n = chunk_scales(lasts, N)
        du, leaving = [None] * N, [None] * N                                  # leaving[n] = G_{n+1}
        for n in range(N - 1, -1, -1):
            leaving[n] = G
            du[n] = torch.baddbmm(du_direct[n], K_n[n], G)                        # + K_n G_{n+1}
            carried = dS_direct[n] + G if lasts is None else torch.addcmul(dS_direct[n], lasts_n[n], G)
            G = torch.baddbmm(carried, Wt_n[n], du[n], alpha=-1)                 # - W_n^T du_n
        du, G_out = torch.stack(du, dim=1), torch.stack(leaving, dim=1)      # (BH, N, C, Dv), (BH, N, Dk, Dv)
        du_f, S_in_t = chunks_flat(du), chunks_flat(S_in).transpose(1, 2)
        dW = torch.bmm(du_f, S_in_t).neg_()
        dQ = torch.bmm(dO, S_in_t)
        dscores = torch.bmm(dO, chunks_flat(u).transpose(1, 2))
        dK = torch.bmm(chunks_flat(u), chunks_flat(G_out).transpose(1, 2))
        dlasts = None if lasts is None else (G_out * S_in).sum(dim=(-1, -2)).view(B, H, N)
        du, dW, dQ, dscores, dK = (t.view(B, H, N, *t.shape[-2:]) for t in (du, dW, dQ, dscores, dK))
        return du, dW, dQ, dscores, dK, dlasts, G.view(B, H, Dk, Dv)


def chunk_slices(*ts):
    """For each t (B, H, N, r, c) or (BH, N, r, c): its N chunks as (BH, r, c) views, cut by one unbind
    (indexing t[:, n] in the loop would cost a dispatch per tensor and chunk)."""
    return [t.reshape(-1, t.size(-3), *t.shape[-2:]).unbind(1) for t in ts]


def chunk_scales(lasts, N):
    """lasts (B, H, N) as N scales (BH, 1, 1), or N Nones without a decay."""
    return [None] * N if lasts is None else lasts.reshape(-1, N, 1, 1).unbind(1)


def chunks_flat(t):
    """(..., r, c) -> (-1, r, c): every head's every chunk as one batch for bmm."""
    return t.reshape(-1, *t.shape[-2:])
