"""The recording hook analyze.py reads: what every attention layer attends to, off by default.

While `record_attention()` is active, `attention.base.attend` hands its call to
`recorded_attention` (plain fp32 softmax math that keeps the probabilities) whatever attn_impl
says, gated linear attention's layer stores its q, k and decay through `record_linear`, and a convolution
its taps through `record_weights`.
While off, the cost is one `state is None` check per call.
"""
import contextlib

import torch
import torch.nn.functional as F

from attention.positional import score_bias, visible_keys

state = None   # {"records": [...], "force_uniform": bool} while record_attention is active


@contextlib.contextmanager
def record_attention(force_uniform: bool = False):
    """Record what every attention layer attends to, in call order (one entry per layer and
    forward). While active, `attend` takes the plain path below whatever attn_impl says:
    explicit fp32 scores, softmax, probs @ v, and appends
        {"probs": (B, H, Tq, Tk) fp32, "allowed": (Tq, Tk) or (H, Tq, Tk) bool, "q_pos", "k_pos"}
    (the probabilities it used for its output); layers without a softmax call `record_linear`.
    force_uniform=True is a test hook: every query spreads its weight evenly over the keys it
    may see (scores all zero), which is the baseline the analysis compares against."""
    global state
    previous, state = state, {"records": [], "force_uniform": force_uniform}
    try:
        yield state["records"]
    finally:
        state = previous


def record_linear(q, k, g, pos, scale):
    """Gated linear attention's hook: store its q (B, H, T, D), k and log-decay g (B, Hkv, T, D)
    (g None: no decay) when recording; analyze.py derives each past token's weight from them."""
    if state is not None:
        state["records"].append({"q": q.detach().float(), "k": k.detach().float(), "pos": pos, "scale": scale,
                                      "g": None if g is None else g.detach().float()})


def record_weights(probs, allowed):
    """A layer whose weights are not a softmax's stores them as they are (conv: each tap's mean |weight|
    over the channels, per query over the tokens it reads): probs (B, H, Tq, Tk), allowed (Tq, Tk) bool."""
    if state is not None:
        state["records"].append({"probs": probs.detach().float(), "allowed": allowed})


def recorded_attention(q, k, v, q_pos, k_pos, alibi_slopes, keep, scale, dropout_p, window=None, forget=None):
    """`attend` in plain math, keeping the probabilities (see record_attention)."""
    G = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)   # a KV head per query head
    allowed = visible_keys(q_pos, k_pos, keep, window)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale          # (B, H, Tq, Tk)
    if state["force_uniform"]:
        scores = torch.zeros_like(scores)
    elif alibi_slopes is not None or forget is not None:
        scores = scores + score_bias(alibi_slopes, forget, q_pos, k_pos)
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    state["records"].append({"probs": probs.detach(), "allowed": allowed, "q_pos": q_pos, "k_pos": k_pos})
    return (F.dropout(probs, p=dropout_p) @ v.float()).to(v.dtype)
