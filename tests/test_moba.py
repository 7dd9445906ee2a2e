"""attention=moba against references written here: the block choice made by loops over queries
and blocks, applied as a mask to a hand-written softmax; dense causal attention (MHA with the same
weights) when every earlier block is chosen; causality by perturbing future tokens; decoding."""
import math

import pytest
import torch

import attention.moba as moba
from helpers import decode_in_chunks, naive_gap, perturbed_model, tiny_model_kwargs
from model import GPT, GPTConfig


def chosen_mask_by_loops(q, k, blk, topk):
    """bool (B, H, T, T): query t reads its own block and the topk earlier blocks with the largest
    q_t . mean(k of the block), ties to the earlier block; loops, no tensor tricks."""
    B, H, T, _ = q.shape
    G = H // k.size(1)
    keep = torch.zeros(B, H, T, T, dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                own = t // blk
                gates = [(float(q[b, h, t] @ k[b, h // G, j * blk:(j + 1) * blk].mean(0)), j) for j in range(own)]
                picked = [j for _, j in sorted(gates, key=lambda g: (-g[0], g[1]))[:topk]] + [own]
                for j in picked:
                    keep[b, h, t, j * blk:min((j + 1) * blk, t + 1)] = True
    return keep


def masked_softmax_reference(layer, x, keep):
    """The layer's output with the attention written out: scores, keep mask, ALiBi, softmax, c_proj."""
    B, T, _ = x.shape
    pos = torch.arange(T)
    q, k, v = layer.project(x, pos)
    G = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    if layer.alibi_slopes is not None:
        scores = scores - layer.alibi_slopes.view(-1, 1, 1) * (pos[:, None] - pos[None, :])
    y = scores.masked_fill(~keep, float("-inf")).softmax(-1) @ v
    return layer.c_proj(y.transpose(1, 2).reshape(B, T, -1))


def moba_model(pos_encoding="rope", blk=4, topk=2, **kw):
    return perturbed_model(attention="moba", pos_encoding=pos_encoding, sparse_block=blk, moba_topk=topk, **kw)


@pytest.mark.parametrize("attn_impl", ["auto", "triton"])  # triton: no kernel takes moba, PyTorch runs
@pytest.mark.parametrize("path", ["gathered", "dense"])
@pytest.mark.parametrize("pos_encoding,blk,topk,T", [("rope", 4, 2, 26), ("alibi", 3, 1, 20), ("none", 5, 2, 25)])
def test_both_paths_equal_the_loop_reference(path, pos_encoding, blk, topk, T, attn_impl, monkeypatch):
    """Outputs and gradients; T not a multiple of the block in two cases (a ragged last block)."""
    monkeypatch.setattr(moba, "GATHER_FROM", 0 if path == "gathered" else 10 ** 9)
    layer = moba_model(pos_encoding, blk, topk, n_kv_head=2, attn_impl=attn_impl).h[0].attn
    x = torch.randn(2, T, 32, requires_grad=True)
    with torch.no_grad():
        q, k, _ = layer.project(x, torch.arange(T))
        keep = chosen_mask_by_loops(q, k, blk, topk)
    out = layer(x, torch.arange(T))
    ref = masked_softmax_reference(layer, x, keep)
    assert (out - ref).abs().max().item() <= 1e-5
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, [x, layer.c_attn.weight], g)
    ref_grads = torch.autograd.grad(ref, [x, layer.c_attn.weight], g)
    for a, b in zip(grads, ref_grads):
        assert (a - b).abs().max().item() <= 1e-5


@pytest.mark.parametrize("path", ["gathered", "dense"])
def test_no_query_reads_a_later_token(path, monkeypatch):
    monkeypatch.setattr(moba, "GATHER_FROM", 0 if path == "gathered" else 10 ** 9)
    model = moba_model("rope", blk=4, topk=1)
    idx = torch.randint(0, 65, (1, 32), generator=torch.Generator().manual_seed(1))
    changed = idx.clone()
    changed[:, 17:] = (changed[:, 17:] + 7) % 65
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    assert (a[:, :17] - b[:, :17]).abs().max().item() == 0.0
    assert (a[:, 17:] - b[:, 17:]).abs().max().item() > 1e-3


@pytest.mark.parametrize("path", ["gathered", "dense"])
def test_topk_covering_every_earlier_block_is_dense_causal_attention(path, monkeypatch):
    monkeypatch.setattr(moba, "GATHER_FROM", 0 if path == "gathered" else 10 ** 9)
    sparse = moba_model("alibi", blk=4, topk=8, n_kv_head=2)          # 8 blocks of 4 in block_size 32
    dense = GPT(GPTConfig(**tiny_model_kwargs(attention="gqa", pos_encoding="alibi", n_kv_head=2))).eval()
    dense.load_state_dict(sparse.state_dict())                        # moba adds no parameters
    idx = torch.randint(0, 65, (2, 32), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (sparse(idx)[0] - dense(idx)[0]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("attn_impl", ["auto", "triton"])
def test_prefill_then_steps_equal_the_full_forward(attn_impl, monkeypatch):
    """A gathered prefill of 13 tokens, then one token at a time: each step chooses its blocks
    from the cache as the full forward chose them."""
    monkeypatch.setattr(moba, "GATHER_FROM", 0)
    model = moba_model("rope", blk=4, topk=2, n_kv_head=2, attn_impl=attn_impl)
    idx = torch.randint(0, 65, (2, 32), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full, _ = model(idx)
        stepped, _ = decode_in_chunks(model, idx, splits=(13,))
    assert (stepped - full).abs().max().item() <= 1e-4


def test_greedy_generation_is_the_same_without_the_cache():
    model = moba_model("rope", blk=4, topk=1)
    prompt = torch.randint(0, 65, (1, 6), generator=torch.Generator().manual_seed(4))
    assert torch.equal(model.generate(prompt, 40, temperature=0.0),
                       model.generate(prompt, 40, temperature=0.0, use_cache=False))


def test_naive_is_the_dense_masked_form():
    model = moba_model("alibi", blk=4, topk=1)
    idx = torch.randint(0, 65, (2, 30), generator=torch.Generator().manual_seed(5))
    assert naive_gap(model, idx) <= 1e-5


def test_moba_refuses_bad_settings():
    with pytest.raises(ValueError, match="moba_topk=0"):
        GPTConfig(**tiny_model_kwargs(attention="moba", moba_topk=0))
    with pytest.raises(ValueError, match="sparse_block=64"):
        GPTConfig(**tiny_model_kwargs(attention="moba", sparse_block=64))   # block_size is 32
    with pytest.raises(ValueError, match="moba_topk=3 is set but no variant of attention=swa reads it"):
        GPTConfig(**tiny_model_kwargs(attention="swa", moba_topk=3))
