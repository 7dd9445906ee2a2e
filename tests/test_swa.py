"""attention=swa against references written here: the band-masked softmax computed by hand, decoding
past the window against full forwards, and the ring cache's size. The Triton path is checked in
tests/attn_kernels (the kernel's window against attn_kernels/reference.py, and a swa model trained with
attn_impl=triton against sdpa)."""
import math

import pytest
import torch

from helpers import decode_in_chunks, naive_gap, perturbed_model, tiny_model_kwargs
from model import GPTConfig


def band_reference(layer, x):
    """The layer's output with its attention written out: scores, the mask i - W < j <= i, ALiBi
    as -m_h (i - j), softmax, through c_proj. Only project() and c_proj are the layer's."""
    B, T, _ = x.shape
    pos = torch.arange(T)
    q, k, v = layer.project(x, pos)
    G = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    i, j = pos[:, None], pos[None, :]
    if layer.alibi_slopes is not None:
        scores = scores - layer.alibi_slopes.view(-1, 1, 1) * (i - j)
    scores = scores.masked_fill(~((j <= i) & (j > i - layer.window)), float("-inf"))
    y = scores.softmax(-1) @ v
    return layer.c_proj(y.transpose(1, 2).reshape(B, T, -1))


def swa_model(pos_encoding="rope", window=5, **kw):
    return perturbed_model(attention="swa", pos_encoding=pos_encoding, sliding_window=window, **kw)


@pytest.mark.parametrize("pos_encoding", ["rope", "alibi", "none"])
@pytest.mark.parametrize("T,window", [(30, 4), (30, 13), (9, 20)],
                         ids=["chunked", "dense-masked", "window-past-the-sequence"])
def test_forward_and_gradients_equal_the_band_reference(pos_encoding, T, window):
    layer = swa_model(pos_encoding, window, n_kv_head=2).h[0].attn
    x = torch.randn(2, T, 32, requires_grad=True)
    out = layer(x, torch.arange(T))
    ref = band_reference(layer, x)
    assert (out - ref).abs().max().item() <= 1e-5
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, [x, layer.c_attn.weight], g)
    ref_grads = torch.autograd.grad(ref, [x, layer.c_attn.weight], g)
    for a, b in zip(grads, ref_grads):
        assert (a - b).abs().max().item() <= 1e-5


@pytest.mark.parametrize("pos_encoding", ["rope", "alibi", "none"])
def test_decoding_past_the_window_equals_the_full_forward(pos_encoding):
    """A prefill longer than the window, then one token at a time to 3x block_size: every step's
    logits equal a full forward over the whole sequence (the ring drops only keys out of reach)."""
    model = swa_model(pos_encoding, window=5)
    idx = torch.randint(0, 65, (2, 96), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = model(idx)
        stepped, _ = decode_in_chunks(model, idx, splits=(12,))
    assert (stepped - full).abs().max().item() <= 1e-4


@pytest.mark.parametrize("pos_encoding", ["rope", "alibi", "none"])
def test_one_layer_step_equals_a_forward_over_the_last_window(pos_encoding):
    """One layer: the output at t depends on tokens t-W+1..t only, at relative positions."""
    model = swa_model(pos_encoding, window=6, n_layer=1)
    idx = torch.randint(0, 65, (1, 40), generator=torch.Generator().manual_seed(2))
    caches = model.init_caches(1, 40)
    with torch.no_grad():
        for t in range(40):
            step = model(idx[:, t:t + 1], caches=caches)[0][:, -1]
            window = model(idx[:, max(0, t - 5):t + 1])[0][:, -1]
            assert (step - window).abs().max().item() <= 1e-4


def test_cache_bytes_stop_growing_at_the_window():
    model = swa_model(window=5)
    caches = model.init_caches(1, 64)
    per_token = 2 * model.config.n_kv_head * (32 // 4) * 4  # K and V, fp32, per layer
    sizes = []
    with torch.no_grad():
        model(torch.zeros(1, 3, dtype=torch.long), caches=caches)
        for _ in range(20):
            model(torch.zeros(1, 1, dtype=torch.long), caches=caches)
            sizes.append(sum(c.nbytes() for c in caches))
    assert set(sizes) == {per_token * 5 * 2}  # 2 layers, 5 slots each, from the first step on
    assert sum(c.nbytes() for c in model.init_caches(1, 3)) == per_token * 3 * 2  # shorter: fewer slots


def test_greedy_generation_past_block_size_is_the_same_without_the_cache():
    model = swa_model(window=6)
    prompt = torch.randint(0, 65, (1, 10), generator=torch.Generator().manual_seed(3))
    cached = model.generate(prompt, 80, temperature=0.0)              # block_size is 32
    recomputed = model.generate(prompt, 80, temperature=0.0, use_cache=False)
    assert torch.equal(cached, recomputed)


def test_naive_equals_sdpa_on_the_model():
    model = swa_model("alibi", window=7)
    idx = torch.randint(0, 65, (2, 32), generator=torch.Generator().manual_seed(4))
    assert naive_gap(model, idx) <= 1e-5


def test_swa_refuses_learned_positions_and_a_window_below_one():
    with pytest.raises(ValueError, match="learned"):
        GPTConfig(**tiny_model_kwargs(attention="swa", pos_encoding="learned"))
    with pytest.raises(ValueError, match="sliding_window=0"):
        GPTConfig(**tiny_model_kwargs(attention="swa", sliding_window=0))
    with pytest.raises(ValueError, match="sliding_window=8 is set but no variant of attention=mha reads it"):
        GPTConfig(**tiny_model_kwargs(attention="mha", sliding_window=8))
