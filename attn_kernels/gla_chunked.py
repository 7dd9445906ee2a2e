"""Gated linear attention in chunked PyTorch, beside its Triton kernel (attn_kernels/gla.py).

The recurrence, per KV head, with g <= 0 the log-decay and S the (Dk, Dv) state:

    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t          o_t = scale * q_t S_t

Two computations of it with the signature of attn_kernels.gla.chunk_gla (k, v, g and the state may
have fewer heads than q, query head h reading KV head h // (H/Hkv); g None means no decay):
    chunk_gla             the chunked parallel form: training and prefill in PyTorch
    recurrent_gla_step    one token against the state: decoding
The third, the loop the other two are tested against, is attn_kernels.reference.naive_recurrent_gla.
All compute in fp32 whatever autocast says. Needs only PyTorch.
"""
import functools

import torch
import torch.nn.functional as F

MAX_FACTORED_SPAN = 40.0    # nats a chunk may decay for chunk_gla's one-matmul intra-chunk form
MAX_SUB_CHUNK_SPAN = 40.0   # nats a sub-chunk may decay for its diagonal blocks to be factored too


def in_fp32(fn):
    """Run the recurrence math in fp32 even under autocast: autocast would run the einsums
    in bf16/fp16, where the state loses precision and (fp16) exp(40) overflows. Without
    autocast on, fn runs as called: entering the context costs more than a decoding step's math."""
    @functools.wraps(fn)
    def wrapper(q, *args, **kwargs):
        if not torch.is_autocast_enabled(q.device.type):
            return fn(q, *args, **kwargs)
        with torch.autocast(q.device.type, enabled=False):
            return fn(q, *args, **kwargs)
    return wrapper


def fp32(t: torch.Tensor) -> torch.Tensor:
    """t in fp32: itself when it already is (t.float() costs a dispatch even then; a step makes several)."""
    return t if t.dtype == torch.float32 else t.float()


def in_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t.to(dtype) without the dispatch when t already has it."""
    return t if t.dtype == dtype else t.to(dtype)


def time_chunks(x: torch.Tensor, C: int) -> torch.Tensor:
    """(B, h, T, ...) -> (B, h, N, C, ...) in fp32, time zero-padded at the end to N * C tokens (no copy
    when T fills the chunks). Zeros in k, v, g (and the delta rule's beta) change neither outputs nor state."""
    pad = (-x.size(2)) % C
    x = F.pad(fp32(x), (0, 0) * (x.dim() - 3) + (0, pad)) if pad else fp32(x)
    return x.view(x.size(0), x.size(1), x.size(2) // C, C, *x.shape[3:])


def first_tokens(x: torch.Tensor, T: int) -> torch.Tensor:
    """x[:, :, :T], time_chunks' padding dropped: no slice when there is none, since a slice's backward
    writes its gradient into a zeroed copy of the whole input (on a CPU a fill and a copy of x's size)."""
    return x if x.size(2) == T else x[:, :, :T]


@in_fp32
def recurrent_gla_step(q, k, v, g, state, scale=None):
    """One decoding step: q (B, H, 1, Dk); k (B, Hkv, 1, Dk); v (B, Hkv, 1, Dv); g (B, Hkv, 1, Dk) or
    any shape that broadcasts to it (a fixed per-head decay: (1, Hkv, 1, 1)), None for no decay;
    state (B, Hkv, Dk, Dv) fp32. Returns o (B, H, 1, Dv) and the next state.
    A handful of ops on (1, Dk)-row views, since at batch 1 each op's overhead is the cost."""
    B, H, _, Dk = q.shape
    Hkv, Dv = k.size(1), v.size(-1)
    scale = Dk ** -0.5 if scale is None else scale
    if g is not None:                                                  # forget: decay each key row
        state = fp32(g).exp().transpose(-1, -2) * state
    state = torch.addcmul(state, fp32(k).transpose(-1, -2), fp32(v))   # write: outer product k^T v
    o = torch.bmm(fp32(q).reshape(B * Hkv, H // Hkv, Dk), state.reshape(B * Hkv, Dk, Dv)).mul_(scale)  # read: q S
    return in_dtype(o.view(B, H, 1, Dv), q.dtype), state


# chunk_gla's numerical safety. Every exponent in its formulas (the docstring) is <= 0 except
# the intra-chunk exp(b_i - b_j) when factored the textbook way, (q_i * exp(b_i)) . (k_j * exp(-b_j)): exp(-b_j)
# overflows fp32 once a chunk decays by more than ~88 nats. Two ways, chosen per call:
#
# - factored (fast: one matmul), when no chunk decays by more than MAX_FACTORED_SPAN
#   = 40 nats: every factor then lies in [e^-40, e^40], far from fp32's limits (also
#   through the backward), and each product equals the direct one to a few ulps. This
#   is the usual case at initialisation (GLA's g = logsigmoid(.)/16 decays ~0.04-1 nats a
#   step); trained gates can decay a 64-token chunk by far more (the recall study's GLA layers do);
# - sub-chunked, otherwise: sub-chunks of c ~ sqrt(C) tokens (8 for C = 64), where no
#   exponent is ever positive:
#
#           j: sub-chunk 0   1   2   3
#     i: 0     [ D0 ]                      D = diagonal block: pairwise (c, c, Dk)
#        1     [ F  ][ D1 ]                    tensor exp(b_i - b_j), exponent masked
#        2     [ F  ][ F  ][ D2 ]              to -inf above the diagonal before exp
#        3     [ F  ][ F  ][ F  ][ D3 ]    F = factored through r = b at the first token
#                                              of the row's sub-chunk: exp(b_i - r) and
#                                              exp(r - b_j), both exponents <= 0
#   so only a (C/c, C, Dk) and a (C, c, Dk) tensor per chunk are formed, not (C, C, Dk)
#   (flash-linear-attention's kernel does the same with c = 16, the pairs in registers).
#   When no sub-chunk decays by more than MAX_SUB_CHUNK_SPAN, the D blocks are factored through
#   r as well (exp(r - b_j) <= e^40 for a key of the row's own sub-chunk): one batched matmul
#   per sub-chunk row, then the causal mask, instead of the pairwise tensor; and with the largest
#   sub-chunk (c, 2c, 4c, ... < C) that stays within the bound, since the key tensor holds C/c
#   copies of the chunk's keys (bench --suite=gla --only=paths times each path).
@in_fp32
def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, chunk_size=64):
    """The chunked parallel form (GLA paper, section 4): same arguments and results as
    naive_recurrent_gla; differentiable by autograd in q, k, v, g and initial_state.

    Time is cut into N chunks of C tokens (the tail is zero-padded: k = v = g = 0 there
    changes neither the outputs nor the final state). Within chunk n, with
    b_i = g_0 + ... + g_i the cumulative log-decay from the chunk's start (b <= 0, falling):

        o_i = scale * [ (q_i * exp(b_i)) S_n                                   (inter-chunk)
                       + sum_{j<=i} (sum_d q_id k_jd exp(b_id - b_jd)) v_j ]   (intra-chunk)
        S_{n+1} = exp(b_{C-1}) * S_n + sum_j (k_j * exp(b_{C-1} - b_j))^T v_j

    Numerical safety: the comment above the function.
    """
    B, H, T, Dk = q.shape
    Hkv, Dv = k.size(1), v.size(-1)
    G = H // Hkv
    scale = Dk ** -0.5 if scale is None else scale
    C = chunk_size
    N = (T + C - 1) // C  # chunks; time_chunks zero-pads the last

    qc = (time_chunks(q, C) * scale).view(B, Hkv, G, N, C, Dk)         # (B, Hkv, G, N, C, Dk)
    kc, vc = time_chunks(k, C), time_chunks(v, C)                      # (B, Hkv, N, C, Dk|Dv)
    # j <= i: a product with a 0/1 mask (masked_fill and tril run several times slower on CPU on
    # these batched layouts); every score is finite here, so the product is exact
    causal = torch.ones(C, C, dtype=torch.float32, device=q.device).tril()

    if g is None:  # plain linear attention: no decay anywhere
        A = (qc @ kc[:, :, None].transpose(-1, -2)) * causal           # (B, Hkv, G, N, C, C)
        q_inter, k_end, chunk_decay = qc, kc, None
    else:
        # Step 1: cumulative log-decay from each chunk's start.
        b = time_chunks(g, C).cumsum(dim=-2)                           # (B, Hkv, N, C, Dk)
        b_last = b[..., -1:, :]                                        # (B, Hkv, N, 1, Dk)
        decay_last = b_last.exp()                                      # how much each chunk decays in all
        q_inter = qc * b.exp()[:, :, None]                             # exp(b_i) <= 1
        # Step 2: intra-chunk scores A (B, Hkv, G, N, C, C), factored or sub-chunked (above).
        form = intra_chunk_form(b)
        if form == C:
            k_rel = kc * (-b).exp()                                    # exp(-b_j) <= e^40
            A = (q_inter @ k_rel[:, :, None].transpose(-1, -2)) * causal
            k_end = k_rel * decay_last                                 # Step 3's keys from the same exp
        else:
            A = _intra_chunk_scores(qc, kc, b, _sub_chunk(C), form)
            k_end = kc * (b_last - b).exp()                            # exp(b_{C-1} - b_j) <= 1
        # Step 3: what each chunk adds to the state (k_end) and how much it decays the old one.
        chunk_decay = decay_last.squeeze(-2)                           # (B, Hkv, N, Dk)
    o_intra = A @ vc[:, :, None]                                       # (B, Hkv, G, N, C, Dv)
    U = k_end.transpose(-1, -2) @ vc                                   # (B, Hkv, N, Dk, Dv)

    # Step 4: pass the state from chunk to chunk (N small sequential steps).
    S = q.new_zeros(B, Hkv, Dk, Dv, dtype=torch.float32) if initial_state is None else initial_state.float()
    entering = []
    decays = [None] * N if chunk_decay is None else chunk_decay[..., None].unbind(2)
    for U_n, decay in zip(U.unbind(2), decays):   # unbind: one gradient stack, not a zero fill per chunk
        entering.append(S)
        S = (S if decay is None else decay * S) + U_n
    S_in = torch.stack(entering, dim=2)                                # (B, Hkv, N, Dk, Dv)

    # Step 5: outputs = what the earlier chunks left in the state + the chunk itself.
    o = q_inter @ S_in[:, :, None] + o_intra
    o = first_tokens(o.reshape(B, H, N * C, Dv), T).to(q.dtype)
    return o, (S if output_final_state else None)


def _sub_chunk(C):
    """The divisor c of C nearest sqrt(C) (the smaller on a tie): the two tensors of
    _intra_chunk_scores hold C/c + c elements per token and key dim, least at c = sqrt(C)."""
    return min((c for c in range(1, C + 1) if C % c == 0), key=lambda c: (C // c + c, c))


def intra_chunk_form(b):
    """How chunk_gla computes the intra-chunk scores for the cumulative log-decay b (B, Hkv, N, C, Dk):
    C, the one-matmul form (no chunk decays past MAX_FACTORED_SPAN); a sub-chunk size, factored through
    sub-chunks of it; or None, the pairwise diagonal blocks (the comment above chunk_gla)."""
    C = b.size(-2)
    if b.min().item() >= -MAX_FACTORED_SPAN:  # b falls from <= 0: its min is the largest span
        return C
    return _largest_factored_sub_chunk(b, _sub_chunk(C))


def _intra_chunk_scores(qc, kc, b, c, factored=None):
    """sum_d q_id k_jd exp(b_id - b_jd) for j <= i within each chunk, else 0.

    qc (B, Hkv, G, N, C, Dk), kc and b (B, Hkv, N, C, Dk), c divides C; factored: the sub-chunk size
    intra_chunk_form chose (None: pairwise diagonal blocks of c). Returns (B, Hkv, G, N, C, C).
    """
    if factored:
        return _factored_through_sub_chunks(qc, kc, b, factored)
    B, Hkv, G, N, C, Dk = qc.shape
    ns = C // c
    bs = b.view(B, Hkv, N, ns, c, Dk)
    # Off-diagonal blocks: the keys of earlier sub-chunks, through r (both factors <= 1).
    A = _through_sub_chunk_starts(qc, kc, b, c, own=False)              # (B, Hkv, G, N, ns, c, C)
    # Diagonal blocks: pairwise exp(b_i - b_j) for j <= i inside a sub-chunk.
    tri = torch.ones(c, c, dtype=torch.bool, device=qc.device).tril()
    pair = (bs[..., :, None, :] - bs[..., None, :, :]).masked_fill(~tri[:, :, None], float("-inf"))
    k_pair = kc.view(B, Hkv, N, ns, 1, c, Dk) * pair.exp()             # (B, Hkv, N, ns, c, c, Dk)
    A_diag = torch.einsum("bhgnsid,bhnsijd->bhgnsij", qc.view(B, Hkv, G, N, ns, c, Dk), k_pair)
    # Put each diagonal block in its place: A is zero there so far (those keys were masked).
    eye = torch.eye(ns, device=qc.device, dtype=qc.dtype)[:, None, :, None]   # (ns, 1, ns, 1)
    A = A.view(B, Hkv, G, N, ns, c, ns, c) + A_diag[..., None, :] * eye
    return A.reshape(B, Hkv, G, N, C, C)


def _largest_factored_sub_chunk(b, c):
    """The largest of c, 2c, 4c, ... below C (dividing it) whose every sub-chunk decays by at most
    MAX_SUB_CHUNK_SPAN (so its diagonal blocks may be factored too), or None. Sub-chunks of 2c hold
    those of c, so one that fails fails every larger one. b (B, Hkv, N, C, Dk), the cumulative decay."""
    B, Hkv, N, C, Dk = b.shape
    sizes = [c]
    while sizes[-1] * 2 < C and C % (sizes[-1] * 2) == 0:
        sizes.append(sizes[-1] * 2)
    for size in reversed(sizes):
        bs = b.view(B, Hkv, N, C // size, size, Dk)
        if (bs[..., 0, :] - bs[..., -1, :]).max().item() <= MAX_SUB_CHUNK_SPAN:   # b falls: first - last
            return size
    return None


def _factored_through_sub_chunks(qc, kc, b, c):
    """_intra_chunk_scores when no sub-chunk of c tokens decays by more than MAX_SUB_CHUNK_SPAN: every
    block factored through r, the diagonal ones too (a key of the query's own sub-chunk weighs
    exp(r - b_j) in [1, e^40]), then j <= i. Returns (B, Hkv, G, N, C, C)."""
    B, Hkv, G, N, C, _ = qc.shape
    A = _through_sub_chunk_starts(qc, kc, b, c, own=True)
    return A.reshape(B, Hkv, G, N, C, C) * torch.ones(C, C, device=kc.device).tril()


def _through_sub_chunk_starts(qc, kc, b, c, own):
    """sum_d (q_id exp(b_id - r)) (k_jd exp(r - b_jd)) with r = b at the first token of query i's
    sub-chunk of c, for the keys before that sub-chunk (own=False; exp(r - b_j) <= 1) or up to its
    end (own=True; inside it exp(r - b_j) >= 1, bounded by the caller's span check); the exponent of
    every later key is set to -inf before exp, so it adds an exact 0 without ever overflowing.
    qc (B, Hkv, G, N, C, Dk); kc, b (B, Hkv, N, C, Dk). Returns (B, Hkv, G, N, C/c, c, C)."""
    B, Hkv, G, N, C, Dk = qc.shape
    ns = C // c
    bs = b.view(B, Hkv, N, ns, c, Dk)
    ref = bs[..., :1, :]                                               # r: (B, Hkv, N, ns, 1, Dk)
    q_rel = qc.view(B, Hkv, G, N, ns, c, Dk) * (bs - ref).exp()[:, :, None]   # exp(b_i - r) <= 1
    idx = torch.arange(C, device=qc.device)
    keys = idx[None, :] < (idx[::c][:, None] + (c if own else 0))      # (ns, C): the keys sub-chunk s reads
    k_exp = (ref - b[:, :, :, None]).masked_fill(~keys[:, :, None], float("-inf"))
    return torch.einsum("bhgnsid,bhnsjd->bhgnsij", q_rel, kc[:, :, :, None] * k_exp.exp())


@in_fp32
def softmax_pair_inputs(q, k, g, initial_state=None):
    """Efficient Attention's softmax pair (Shen et al. 2021) in causal form, with an optional decay,

        S_t = diag(exp(g_t)) S_{t-1} + exp(k_t)^T v_t      Z_t = exp(g_t) * Z_{t-1} + exp(k_t)
        o_t = softmax(q_t) (S_t / Z_t)                      (each feature row of S over its Z; no 1/sqrt(d)),

    rewritten as GLA's recurrence on rescaled inputs, stable for keys of any size as online softmax
    is: with a_t = k_t - (g_1 + ... + g_t), key j weighs exp(a_j) at time t up to a factor common to
    the feature row; with the running max m_t = max_{j<=t} a_j, S~_t = sum_j exp(a_j - m_t) v_j is GLA
    with key exp(a_t - m_t) <= 1 and log-decay m_{t-1} - m_t <= 0, and Z~_t = exp(logcumsumexp(a)_t - m_t)
    >= 1 divides the query: o_t = (softmax(q_t) / Z~_t) S~_t, scale 1.

    q (B, H, T, D); k, g (B, Hkv, T, D) (g None: no decay); initial_state (B, Hkv, D, Dv + 3) packs
    [S~ | log Z~ | m | decay so far] (None: nothing seen). Returns GLA's (q, k, g), its initial S~ and
    the (B, Hkv, D, 3) tail of the final state.
    """
    B, H, T, D = q.shape
    Hkv = k.size(1)
    k = k.float()
    if initial_state is None:
        S0, log_z0 = None, k.new_full((B, Hkv, D), float("-inf"))
        decay0, m0 = k.new_zeros(B, Hkv, D), k[:, :, 0]              # start the max at the first key
    else:
        S0, (log_z0, m0, decay0) = initial_state[..., :-3], initial_state[..., -3:].unbind(-1)
    decay = decay0[:, :, None] + (g.float().cumsum(dim=2) if g is not None else 0.0)   # (B, Hkv, T, D)
    a = k - decay
    m = torch.maximum(torch.cummax(a, dim=2).values, m0[:, :, None])
    shift = torch.cat([m0[:, :, None], m[:, :, :-1]], dim=2) - m                      # <= 0
    log_z = torch.logaddexp(log_z0[:, :, None] + m0[:, :, None] - m, torch.logcumsumexp(a, dim=2) - m)
    q_gla = q.float().softmax(dim=-1) / log_z.exp().repeat_interleave(H // Hkv, dim=1)
    tail = torch.stack([log_z[:, :, -1], m[:, :, -1], decay[:, :, -1]], dim=-1)
    return q_gla, (a - m).exp(), shift, S0, tail


def softmax_pair_gla(q, k, v, g, initial_state=None, output_final_state=False, gla=chunk_gla):
    """o (B, H, T, Dv) and the packed state of softmax_pair_inputs, by `gla` (chunk_gla, the Triton
    kernel or attn_kernels.reference.naive_recurrent_gla)."""
    q, k, g, S0, tail = softmax_pair_inputs(q, k, g, initial_state)
    o, S = gla(q, k, v, g, scale=1.0, initial_state=S0, output_final_state=True)
    return o, (torch.cat([S, tail], dim=-1) if output_final_state else None)
