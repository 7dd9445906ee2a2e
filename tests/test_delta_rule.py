"""The delta rule's math (attn_kernels/delta_chunked.py, attn_kernels/reference.py) against a float64 loop
written here from the papers' recurrence: the chunked form, the naive loop and one-token decoding,
in outputs, final states and gradients, with and without Gated DeltaNet's decay."""
import pytest
import torch
import torch.nn.functional as F

from attn_kernels.delta_chunked import chunk_delta_rule, recurrent_delta_step
from attn_kernels.reference import naive_recurrent_delta_rule


def loop64(q, k, v, beta, g, S):
    """S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T in the papers' (Dv, Dk) layout,
    o_t = S_t q_t / sqrt(Dk); float64, one token at a time."""
    q, k, v, beta, S = (x.double() for x in (q, k, v, beta, S.transpose(-1, -2)))
    Dk = q.size(-1)
    eye = torch.eye(Dk, dtype=torch.float64)
    outs = []
    for t in range(q.size(2)):
        kt, vt, bt = k[:, :, t], v[:, :, t], beta[:, :, t, None, None]
        alpha = 1.0 if g is None else g[:, :, t].double().exp()[..., None, None]
        S = alpha * S @ (eye - bt * kt[..., :, None] * kt[..., None, :]) + bt * vt[..., :, None] * kt[..., None, :]
        outs.append((S @ q[:, :, t, :, None])[..., 0] / Dk ** 0.5)
    return torch.stack(outs, dim=2), S.transpose(-1, -2)


def inputs(B=2, H=3, T=23, Dk=8, Dv=6, gated=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, Dk, generator=g)
    k = F.normalize(torch.randn(B, H, T, Dk, generator=g), dim=-1)    # the layers L2-normalise k
    v = torch.randn(B, H, T, Dv, generator=g)
    beta = torch.rand(B, H, T, generator=g)
    decay = -torch.rand(B, H, T, generator=g) * 0.5 if gated else None
    state = torch.randn(B, H, Dk, Dv, generator=g)
    return q, k, v, beta, decay, state


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("chunk", [4, 8, 64])
def test_chunked_and_naive_equal_the_float64_loop(gated, chunk):
    q, k, v, beta, g, S0 = inputs(gated=gated)
    want_o, want_S = loop64(q, k, v, beta, g, S0)
    for o, S in (chunk_delta_rule(q, k, v, beta, g, initial_state=S0, output_final_state=True, chunk_size=chunk),
                 naive_recurrent_delta_rule(q, k, v, beta, g, initial_state=S0, output_final_state=True)):
        assert torch.allclose(o.double(), want_o, atol=1e-5), (o.double() - want_o).abs().max()
        assert torch.allclose(S.double(), want_S, atol=1e-5), (S.double() - want_S).abs().max()


@pytest.mark.parametrize("gated", [False, True])
def test_one_token_steps_equal_the_float64_loop(gated):
    q, k, v, beta, g, S = inputs(gated=gated)
    want_o, want_S = loop64(q, k, v, beta, g, S)
    outs = []
    for t in range(q.size(2)):
        o, S = recurrent_delta_step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], beta[:, :, t:t + 1],
                                    None if g is None else g[:, :, t:t + 1], S)
        outs.append(o)
    assert torch.allclose(torch.cat(outs, dim=2).double(), want_o, atol=1e-5)
    assert torch.allclose(S.double(), want_S, atol=1e-5)


@pytest.mark.parametrize("gated", [False, True])
def test_gradients_equal_the_float64_loop(gated):
    """d(sum(o * w) + sum(S_T * w'))/d(every input) of the chunked form and the naive loop, against
    autograd through the float64 loop (k enters unnormalised here: the math takes any k)."""
    q, k, v, beta, g, S0 = inputs(T=13, gated=gated, seed=1)
    k = k * 0.9
    leaves = [x for x in (q, k, v, beta, g, S0) if x is not None]
    w_o, w_S = torch.randn(q.shape[:3] + v.shape[-1:]), torch.randn(S0.shape)

    def grads(fn, cast):
        xs = [x.detach().to(cast).requires_grad_() for x in leaves]
        q_, k_, v_, b_, *rest = xs
        g_, s_ = (rest if gated else [None, rest[0]])
        o, S = fn(q_, k_, v_, b_, g_, s_)
        ((o.to(cast) * w_o.to(cast)).sum() + (S.to(cast) * w_S.to(cast)).sum()).backward()
        return [x.grad.double() for x in xs]

    want = grads(loop64, torch.float64)
    for fn in (lambda *a: chunk_delta_rule(*a[:5], initial_state=a[5], output_final_state=True, chunk_size=4),
               lambda *a: naive_recurrent_delta_rule(*a[:5], initial_state=a[5], output_final_state=True)):
        for got, ref in zip(grads(fn, torch.float32), want):
            assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4), (got - ref).abs().max()


def test_a_padded_tail_and_a_chunk_longer_than_the_sequence_change_nothing():
    """T = 5 in chunks of 64 (one padded chunk) and T = 23 in chunks of 8 (a padded tail) against
    the float64 loop, gated: padding writes nothing and decays nothing."""
    for T, chunk in ((5, 64), (23, 8)):
        q, k, v, beta, g, S0 = inputs(T=T)
        o, S = chunk_delta_rule(q, k, v, beta, g, initial_state=S0, output_final_state=True, chunk_size=chunk)
        want_o, want_S = loop64(q, k, v, beta, g, S0)
        assert torch.allclose(o.double(), want_o, atol=1e-5) and torch.allclose(S.double(), want_S, atol=1e-5)


def test_the_delta_rule_overwrites_where_linear_attention_adds():
    """What the rule is for: write v1 under key k, then v2 under the same k with beta = 1; reading k
    returns v2 exactly (the old value erased), where an additive state would return v1 + v2."""
    k = F.normalize(torch.randn(1, 1, 1, 8), dim=-1).expand(1, 1, 2, 8)
    v = torch.randn(1, 1, 2, 4)
    _, S = chunk_delta_rule(k, k, v, torch.ones(1, 1, 2), output_final_state=True, chunk_size=4)
    read = k[0, 0, 0] @ S[0, 0]
    assert torch.allclose(read, v[0, 0, 1], atol=1e-6)


# ---------------------------------------------------------------- the layers (attention/deltanet.py)

def layer_reference(attn, x):
    """The DeltaNet layer written out in float64 from its weights, pos_encoding none: the short causal
    conv as a loop over taps, SiLU, L2 norms, beta, Mamba-2's decay, the float64 delta loop, the per-head
    RMSNorm and the swish gate, c_proj."""
    B, T, _ = x.shape
    H, D = attn.n_head, attn.head_dim
    w = {n: p.detach().double() for n, p in attn.named_parameters()}
    x = x.double()
    proj = x @ w["c_attn.weight"].T                                              # (B, T, 3HD)
    K = w["conv_weight"].size(1)
    # y_t = sum_s w[K-1-s] x_{t-s}: the last tap reads the current token (nn.Conv1d's and fla's order)
    conv = sum(F.pad(proj, (0, 0, s, 0))[:, :T] * w["conv_weight"][:, K - 1 - s] for s in range(K))
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in F.silu(conv).split(H * D, dim=-1))
    q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    beta = attn.beta_scale * torch.sigmoid(x @ w["b_proj.weight"].T).transpose(1, 2)
    g = None
    if attn.gated:
        g = (-w["A_log"].exp() * F.softplus(x @ w["a_proj.weight"].T + w["dt_bias"])).transpose(1, 2)
    o, _ = loop64(q, k, v, beta, g, torch.zeros(B, H, D, D, dtype=torch.float64))
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * w["o_norm.weight"]
    o = o.transpose(1, 2) * F.silu(x @ w["r_proj.weight"].T).view(B, T, H, D)
    return o.reshape(B, T, H * D) @ w["c_proj.weight"].T


def tiny_delta(attention, seed=0, **kw):
    from helpers import perturbed_model
    return perturbed_model(seed=seed, attention=attention, pos_encoding="none", delta_chunk=8, **kw)


@pytest.mark.parametrize("attention,beta", [("deltanet", "sigmoid"), ("gated_deltanet", "sigmoid"),
                                            ("gated_deltanet", "sigmoid2")])
def test_layer_equals_its_float64_reference(attention, beta):
    model = tiny_delta(attention, delta_beta=beta)
    attn = model.h[0].attn
    x = torch.randn(2, 21, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got = attn(x, torch.arange(21))
    assert torch.allclose(got.double(), layer_reference(attn, x), atol=1e-5)


@pytest.mark.parametrize("attention", ["deltanet", "gated_deltanet"])
def test_naive_and_chunked_layers_agree_in_logits_and_gradients(attention):
    from helpers import set_attn_impl
    idx = torch.randint(0, 65, (2, 27), generator=torch.Generator().manual_seed(2))
    results = []
    for impl in ("sdpa", "naive"):
        model = tiny_delta(attention)
        set_attn_impl(model, impl)
        logits, loss = model(idx, idx)
        loss.backward()
        results.append((logits.detach(), [p.grad for p in model.parameters()]))
    (a, ga), (b, gb) = results
    assert torch.allclose(a, b, atol=1e-5)
    assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(ga, gb))


@pytest.mark.parametrize("attention", ["deltanet", "gated_deltanet"])
def test_measured_state_bytes_equal_the_papers_state_plus_the_conv_window(attention):
    """Per layer: H heads of a (D, D) state and the conv's last 3 inputs of q, k and v (3 H D channels),
    fp32, whatever the length: written here from the shapes, 2 layers, 4 heads of 8."""
    model = tiny_delta(attention)
    want = 2 * (4 * 8 * 8 + (4 - 1) * 3 * 4 * 8) * 4
    for n in (1, 100):
        assert sum(c.nbytes() for c in model.init_caches(1, n)) == want
    assert model.cache_state_elems() * 4 == want and model.cache_elems_per_token() == 0


@pytest.mark.parametrize("kwargs,words", [
    (dict(delta_conv=0), "delta_conv=0 must be at least 1"),
    (dict(delta_beta="tanh"), "unknown delta_beta='tanh'; choose one of sigmoid, sigmoid2"),
    (dict(delta_chunk=0), "delta_chunk=0 must be at least 1"),
    (dict(n_kv_head=2), "keeps one state per head"),
    (dict(pos_encoding="alibi"), "works with pos_encoding none"),
])
def test_bad_settings_are_one_line(kwargs, words):
    from helpers import tiny_model_kwargs
    from model import GPTConfig
    for attention in ("deltanet", "gated_deltanet"):
        with pytest.raises(ValueError, match=words) as e:
            GPTConfig(**tiny_model_kwargs(attention=attention, **kwargs))
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("attention", ["deltanet", "gated_deltanet"])
def test_train_round_trip_and_sample_same_with_and_without_cache(data_root, tmp_path, capsys, attention):
    import json

    import train
    from helpers import assert_sampling_same_with_and_without_cache, train_args
    from model import GPTConfig
    from trainer.checkpoint import model_from_checkpoint
    out = tmp_path / "run"
    train.main(train_args(data_root, out, "--max_iters=30", "--eval_interval=30", f"--attention={attention}",
                          "--pos_encoding=none", "--delta_chunk=16"))
    log = [json.loads(line) for line in open(out / "log.jsonl")]
    assert log[-1]["val_loss"] < log[0]["val_loss"] - 0.3
    summary = json.load(open(out / "summary.json"))
    assert summary["attention"] == attention and summary["kv_cache_bytes_per_token"] == 0
    assert summary["cache_state_bytes"] == 2 * (4 * 8 * 8 + 3 * 3 * 4 * 8) * 4
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    model = model_from_checkpoint(ckpt, GPTConfig(**ckpt["model_args"]))
    assert model.config.attention == attention
    assert all(torch.equal(p, ckpt["model"][n]) for n, p in model.state_dict().items())
    assert_sampling_same_with_and_without_cache(out, capsys)


def test_analyze_reads_the_rule_as_weights_on_the_corrected_values():
    """tools.analyze's weights for a delta layer: o_t = sum_j exp(b_t - b_j) (q_t . k_j) u_j / sqrt(D), with
    u_j = beta_j (v_j - alpha_j S_{j-1}^T k_j) computed here by the float64 loop; analyze's weights are the
    magnitudes of those coefficients, normalised per query."""
    from tools.analyze import linear_attention_weights
    q, k, v, beta, g, _ = inputs(T=11)
    B, H, T, D = q.shape
    S = torch.zeros(B, H, D, v.size(-1), dtype=torch.float64)
    us = []
    for t in range(T):
        S = S * g[:, :, t].double().exp()[..., None, None]
        u = beta[:, :, t, None].double() * (v[:, :, t].double() - torch.einsum("bhd,bhde->bhe", k[:, :, t].double(), S))
        S = S + k[:, :, t, :, None].double() * u[..., None, :]
        us.append(u)
    b = g.double().cumsum(-1)
    coef = (q.double() @ k.double().transpose(-1, -2)) * (b[..., :, None] - b[..., None, :]).exp() / D ** 0.5
    coef = coef.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), 0.0)
    want, _ = loop64(q, k, v, beta, g, torch.zeros(B, H, D, v.size(-1)))
    assert torch.allclose(coef @ torch.stack(us, dim=2), want, atol=1e-10)
    weights, _ = linear_attention_weights(q, k, g[..., None].expand(B, H, T, D), D ** -0.5)
    assert torch.allclose(weights.double(), coef.abs() / coef.abs().sum(-1, keepdim=True), atol=1e-5)


@pytest.mark.parametrize("n", [1, 7, 16, 24, 64, 128])
def test_unit_lower_inverse_equals_the_dense_inverse(n):
    """The UT transform's inverse by halves against torch.linalg.inv in float64, with its gradient."""
    from attn_kernels.delta_chunked import unit_lower_inverse
    A = (torch.randn(2, 3, n, n, dtype=torch.float64) * 0.3).tril(-1).requires_grad_()
    got = unit_lower_inverse(A)
    want = torch.linalg.inv(A + torch.eye(n, dtype=torch.float64))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    w = torch.randn_like(want)
    g_got, = torch.autograd.grad((got * w).sum(), A)
    g_want, = torch.autograd.grad((want * w).sum(), A)
    torch.testing.assert_close(g_got.tril(-1), g_want.tril(-1), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("n", [1, 7, 32, 64])
def test_unit_lower_inverse_function_reads_the_strict_lower_part_and_its_gradient_is_the_inverse_s(n):
    """UnitLowerInverse (the backward written out) against torch.linalg.inv of I + tril(A, -1) in float64,
    with A's diagonal and upper part filled with noise it must ignore: outputs, and a gradient equal to
    the dense inverse's on the strictly lower part and zero elsewhere."""
    from attn_kernels.delta_chunked import UnitLowerInverse
    A = (torch.randn(2, 3, n, n, dtype=torch.float64) * 0.3).requires_grad_()
    strict = A.tril(-1)
    want = torch.linalg.inv(strict + torch.eye(n, dtype=torch.float64))
    got = UnitLowerInverse.apply(A)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    w = torch.randn_like(want)
    g_got, = torch.autograd.grad((got * w).sum(), A)
    g_want, = torch.autograd.grad((want * w).sum(), A)
    torch.testing.assert_close(g_got, g_want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("taps", [1, 2, 4])
def test_short_conv_equals_conv1d_in_outputs_and_gradients(taps):
    """causal_conv (its written-out backward under autograd, the plain sum without, and the one-token
    step) against float64 F.conv1d over [past | x], left to right, then SiLU: outputs, the next past,
    and the gradients of x, the weights and the past."""
    from attention.short_conv import causal_conv
    g = torch.Generator().manual_seed(taps)
    B, T, C = 2, 9, 5
    x, w, past = torch.randn(B, T, C, generator=g), torch.randn(C, taps, generator=g), torch.randn(B, taps - 1, C,
                                                                                                   generator=g)
    w_out = torch.randn(B, T, C, generator=g)

    def run(fn, dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (x, w, past)]
        y, nxt = fn(*leaves)
        (y * w_out.to(dtype)).sum().backward()
        return y.detach().double(), nxt.detach().double(), [t.grad.double() for t in leaves]

    def reference(x, w, past):
        full = torch.cat([past, x], dim=1).transpose(1, 2)                  # (B, C, K-1+T)
        return F.silu(F.conv1d(full, w[:, None], groups=C)).transpose(1, 2), torch.cat([past, x], 1)[:, T:]

    want_y, want_next, want_grads = run(reference, torch.float64)
    got_y, got_next, got_grads = run(causal_conv, torch.float32)
    assert torch.allclose(got_y, want_y, atol=1e-5) and torch.equal(got_next, want_next.float().double())
    for got, want in zip(got_grads, want_grads):
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    with torch.no_grad():
        assert torch.allclose(causal_conv(x, w, past)[0].double(), want_y, atol=1e-5)
        window = past                                      # one token at a time (the decoding step's own sum)
        for t in range(T):
            y_t, window = causal_conv(x[:, t:t + 1], w, window)
            assert torch.allclose(y_t.double(), want_y[:, t:t + 1], atol=1e-5)
