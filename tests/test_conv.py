"""attention=conv (Zoology's BaseConv) and Zoology's MQAR model, attention="conv,<mixer>" with mlp=False:
the layer against BaseConv's formula written with nn.Conv1d (Zoology's own ShortConvolution form),
the model's parts and parameter count against a count written here, cached decoding equal to the
full forward for every mixer family, sampling the same with and without the cache, and one-line
refusals."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import train
from attention.conv import ShortConvMixer
from helpers import accepts, decode_in_chunks, perturbed_model, tiny_model_kwargs, train_args
from helpers import assert_sampling_same_with_and_without_cache as assert_same_samples
from model import GPT, GPTConfig


def baseconv_reference(layer, x):
    """Zoology's BaseConv: y = ShortConvolution(x) * Linear(x) + x, the convolution an nn.Conv1d with
    groups=C padded by K-1 on the left and cut back to T (zoology/mixers/convolution.py)."""
    C, K = layer.conv_weight.shape
    conv = nn.Conv1d(C, C, K, groups=C, padding=K - 1).double()
    with torch.no_grad():
        conv.weight.copy_(layer.conv_weight.detach().double()[:, None, :])
        conv.bias.copy_(layer.conv_bias.detach().double())
    x = x.double()
    c = conv(x.transpose(1, 2))[..., :x.size(1)].transpose(1, 2)
    return c * F.linear(x, layer.proj.weight.double(), layer.proj.bias.double()) + x


@pytest.mark.parametrize("taps", [1, 3, 4])
def test_the_layer_is_zoologys_baseconv(taps):
    torch.manual_seed(0)
    layer = ShortConvMixer(GPTConfig(**tiny_model_kwargs(attention="conv", conv_taps=taps)), 0)
    nn.init.normal_(layer.proj.bias)                   # GPT's init zeroes it: make it count here
    x = torch.randn(2, 11, layer.n_embd)
    assert (layer(x, torch.arange(11)).double() - baseconv_reference(layer, x)).abs().max().item() < 1e-5


def test_the_layer_reads_its_last_taps_tokens():
    layer = ShortConvMixer(GPTConfig(**tiny_model_kwargs(attention="conv", conv_taps=3)), 0)
    seen = layer.keys_seen(6)
    want = torch.tensor([[0 <= i - j < 3 for j in range(6)] for i in range(6)])
    assert torch.equal(seen, want)


def test_zoologys_model_is_a_conv_layer_then_the_mixer_without_mlp():
    C, V, K = 32, 65, 3
    model = GPT(GPTConfig(**tiny_model_kwargs(attention="conv,mha", conv_taps=K, mlp=False, pos_encoding="none")))
    assert [type(b.attn).__name__ for b in model.h] == ["ShortConvMixer", "MultiHeadAttention"]
    assert all(b.mlp is None and b.ln_2 is None for b in model.h)
    conv_layer = C + (C * C + C) + (C * K + C)         # ln_1, proj with bias, conv taps and bias
    mha_layer = C + 3 * C * C + C * C                  # ln_1, c_attn, c_proj (bias=False)
    assert model.config.n_embd == C and model.num_params() == V * C + conv_layer + mha_layer + C


MIXERS = {"conv,mha": {}, "conv,mqa": {}, "conv,swa": dict(sliding_window=8), "conv,gla": dict(gla_chunk=8),
          "conv,deltanet": dict(delta_chunk=8), "conv,moba": dict(sparse_block=4, moba_topk=1), "conv,mla": {},
          "conv,bigbird": dict(sparse_block=4, sparse_window=2)}


@pytest.mark.parametrize("plan,pos", [(a, p) for a in MIXERS for p in ("rope", "none", "learned")
                                      if accepts(attention=a, pos_encoding=p, mlp=False, **MIXERS[a])])
def test_cached_decoding_of_zoologys_model_equals_the_full_forward(plan, pos):
    model = perturbed_model(attention=plan, pos_encoding=pos, mlp=False, **MIXERS[plan])
    idx = torch.randint(0, 65, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = model(idx)
        stepped, caches = decode_in_chunks(model, idx)
    assert (full - stepped).abs().max().item() <= 1e-4
    assert caches[0].state.numel() == 2 * model.h[0].attn.cache_state_elems()   # batch 2: its K-1 inputs


def test_a_trained_zoology_model_samples_the_same_with_and_without_cache(data_root, tmp_path, capsys):
    out = tmp_path / "run"
    train.main(train_args(data_root, out, "--max_iters=40", "--eval_interval=40", "--attention=conv,mha",
                          "--mlp=False", "--pos_encoding=none"))
    assert_same_samples(out, capsys)


@pytest.mark.parametrize("kw,words", [
    (dict(attention="conv,mha", conv_taps=0), "conv_taps=0 must be at least 1"),
    (dict(attention="conv,mha", mlp=False, mlp_hidden=64), "mlp_hidden=64 sets the width of an MLP"),
    (dict(attention="mha", conv_taps=4), "conv_taps=4 is set but no variant of attention=mha"),
])
def test_bad_settings_are_one_line(kw, words):
    with pytest.raises(ValueError, match=words):
        GPTConfig(**tiny_model_kwargs(**kw))


def test_match_params_refuses_a_model_without_mlp():
    from tools.budget import solve_mlp_hidden
    from trainer.settings import MODEL_KEYS
    keys = {k: getattr(GPTConfig(**tiny_model_kwargs(attention="conv,mha", mlp=False)), k) for k in MODEL_KEYS}
    with pytest.raises(ValueError, match="mlp=False has no MLP"):
        solve_mlp_hidden(keys, 10_000, 65)


def test_analyze_records_the_taps_as_weights_by_distance():
    from attention import record
    layer = ShortConvMixer(GPTConfig(**tiny_model_kwargs(attention="conv", conv_taps=3)), 0)
    with record.record_attention() as records:
        layer(torch.randn(1, 5, layer.n_embd), torch.arange(5))
    (r,) = records
    tap = layer.conv_weight.detach().abs().mean(dim=0)             # tap 2 reads the token itself
    for i in range(5):
        seen = [j for j in range(5) if 0 <= i - j < 3]
        total = sum(tap[2 - (i - j)] for j in seen)
        for j in range(5):
            want = tap[2 - (i - j)] / total if j in seen else 0.0
            assert abs(r["probs"][0, 0, i, j].item() - float(want)) < 1e-6
