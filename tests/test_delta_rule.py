"""The delta rule's math (kernels/delta_chunked.py, kernels/reference.py) against a float64 loop
written here from the papers' recurrence: the chunked form, the naive loop and one-token decoding,
in outputs, final states and gradients, with and without Gated DeltaNet's decay."""
import pytest
import torch
import torch.nn.functional as F

from kernels.delta_chunked import chunk_delta_rule, recurrent_delta_step
from kernels.reference import naive_recurrent_delta_rule


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
