"""The model trained with attn_impl=triton follows attn_impl=sdpa loss for loss (fp32).

On CPU the kernel runs under the Triton interpreter (conftest sets TRITON_INTERPRET=1)."""
import os
import subprocess
import sys

import pytest
import torch

from attention import VARIANTS
from model import GPT, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def train_losses(attn_impl, steps=4, block_size=24, **kw):
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=block_size, vocab_size=65, n_layer=2, n_head=4, n_embd=64, attn_impl=attn_impl, **kw)
    model = GPT(cfg).to(DEVICE)
    opt = model.configure_optimizers(0.1, 3e-3, (0.9, 0.99), "cpu")
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, 65, (2, block_size), generator=g).to(DEVICE)
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("kw", [dict(attention="gqa", n_kv_head=2, pos_encoding="rope"),
                                dict(attention="mha", pos_encoding="alibi"),
                                dict(attention="mla", pos_encoding="rope"),
                                # 4 blocks of 16: block 3 sees 0 (global), 2 and 3, not 1; the
                                # last block is ragged (T = 63)
                                dict(attention="bigbird", pos_encoding="alibi", n_kv_head=2, block_size=64,
                                     sparse_block=16, sparse_window=2, sparse_global=1, sparse_random=0),
                                # a window of 9 across the interpreter's 16/32 tiles; sdpa runs the
                                # chunked path there (T = 23 > 2 * 9)
                                dict(attention="swa", pos_encoding="alibi", n_kv_head=2, sliding_window=9),
                                # the linear family on the GLA kernel: a fixed decay and the sum
                                # normaliser's extra value channel (Dv = 17), and the softmax pair
                                dict(attention="gla", pos_encoding="none", gla_gate="fixed", gla_norm="sum",
                                     gla_feature_map="elu", gla_chunk=16),
                                dict(attention="gla", pos_encoding="none", gla_gate="data", gla_norm="none",
                                     gla_feature_map="softmax", gla_chunk=16)],
                         ids=["gqa-rope", "mha-alibi", "mla-rope", "bigbird-alibi-gqa", "swa-alibi-gqa",
                              "linear-fixed-sum", "efficient-data"])
def test_triton_training_matches_sdpa(kw):
    triton_losses, sdpa_losses = train_losses("triton", **kw), train_losses("sdpa", **kw)
    assert max(abs(a - b) for a, b in zip(triton_losses, sdpa_losses)) <= 1e-4
    # the steps change the loss, so equal losses after step 1 mean equal gradients too
    assert abs(triton_losses[-1] - triton_losses[0]) > 1e-3


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter check is for CPU-only machines")
def test_train_and_sample_refuse_triton_on_cpu_without_interpreter(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "train.py", "config/gqa.py", "--attn_impl=triton", "--device=cpu",
                        f"--out_dir={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "TRITON_INTERPRET=1" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # a checkpoint trained with attn_impl=triton (as on a GPU), sampled on a CPU without the interpreter
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=8, vocab_size=3, n_layer=1, n_head=2, n_embd=32, attn_impl="triton")
    meta = {"vocab_size": 3, "dtype": "uint16", "tokenizer": "char", "chars": ["a", "b", "c"]}
    torch.save({"model": GPT(cfg).state_dict(), "model_args": cfg.to_dict(), "meta": meta}, tmp_path / "ckpt.pt")
    r = subprocess.run([sys.executable, "sample.py", f"--out_dir={tmp_path}", "--start=ab", "--device=cpu"],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "TRITON_INTERPRET=1" in r.stderr and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1


# ---- every registered variant and a hybrid plan: a training step and cached decoding ----
# Tiny settings under which a variant's kernel paths run (and its sparsity binds) at 20 tokens;
# a variant not listed builds with its defaults, so one registered later is covered as it is.
TINY_KWARGS = {"gqa": dict(n_kv_head=2),
               "mla": dict(mla_decode="absorbed"),
               # 2 blocks of 16 (the kernel's tiles), each its own window: block 1 never sees block 0
               "bigbird": dict(sparse_block=16, sparse_window=1, sparse_global=0, sparse_random=0),
               "swa": dict(sliding_window=5, n_kv_head=2),        # sdpa chunks it (T = 20 > 2 * 5)
               "gla": dict(gla_chunk=16),                          # a ragged second chunk
               "moba": dict(sparse_block=4, moba_topk=1)}          # 5 blocks: each query reads 2 of them
PLANS = {"gla,mha": dict(n_layer=2, gla_chunk=16)}
POS_ORDER = ("rope", "alibi", "none", "sinusoidal", "learned")   # the first one a variant accepts


def tiny_config(attention, attn_impl):
    kw = dict(block_size=32, vocab_size=65, n_layer=1, n_head=4, n_embd=32, dropout=0.0, bias=False,
              attention=attention, attn_impl=attn_impl)
    kw.update(TINY_KWARGS.get(attention, PLANS.get(attention, {})))
    for pos_encoding in POS_ORDER:
        try:
            return GPTConfig(**kw, pos_encoding=pos_encoding)
        except ValueError as e:
            refusal = e
    raise refusal


@pytest.fixture
def seen(monkeypatch):
    """Calls that reached a Triton kernel, and what each lookup of dispatch's choice answered."""
    import attn_kernels.flash_attn
    import attn_kernels.gla
    from attention.base import Attention
    log = {"kernel": 0, "answers": []}

    def counting(real):
        def wrapper(*args, **kwargs):
            log["kernel"] += 1
            return real(*args, **kwargs)
        return wrapper
    monkeypatch.setattr(attn_kernels.flash_attn, "flash_attention", counting(attn_kernels.flash_attn.flash_attention))
    monkeypatch.setattr(attn_kernels.gla, "chunk_gla", counting(attn_kernels.gla.chunk_gla))
    real_impl = Attention.impl

    def impl(self, device, path="forward"):
        log["answers"].append(real_impl(self, device, path))
        return log["answers"][-1]
    monkeypatch.setattr(Attention, "impl", impl)
    return log


def ran_as_dispatched(log, call):
    """Run call(); True when a kernel ran exactly if some lookup answered triton (a forward body
    that turned triton into PyTorch, or called a kernel unasked, breaks it)."""
    log["kernel"], log["answers"] = 0, []
    out = call()
    return out, (log["kernel"] > 0) == ("triton" in log["answers"])


@pytest.mark.parametrize("attention", [*VARIANTS, *PLANS])
def test_every_variant_trains_and_decodes_on_triton_as_on_sdpa(attention, seen):
    """attn_impl=triton against attn_impl=sdpa, same weights: the loss and gradients of a training
    step, then the logits of a full forward and of cached decoding (a prefill of 7, a chunk of 7,
    one token at a time to 16); each call runs a kernel exactly where dispatch said triton."""
    models = {}
    for impl in ("triton", "sdpa"):
        torch.manual_seed(0)
        models[impl] = GPT(tiny_config(attention, impl)).to(DEVICE)
    models["sdpa"].load_state_dict(models["triton"].state_dict())
    idx = torch.randint(0, 65, (2, 21), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    out = {}
    for impl, model in models.items():
        with torch.no_grad():
            for p in model.parameters():  # larger weights than init, so that positions and heads matter
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())).to(DEVICE) * 0.05)
        (_, loss), ok = ran_as_dispatched(seen, lambda: model(idx[:, :-1], idx[:, 1:]))
        assert ok, f"{impl} training forward"
        loss.backward()
        torch.optim.SGD(model.parameters(), lr=1.0).step()
        model.eval()
        with torch.no_grad():
            (full, _), ok = ran_as_dispatched(seen, lambda: model(idx[:, :16]))
            assert ok, f"{impl} forward"
            caches = model.init_caches(2, 16)
            steps = []
            for a, b in zip([0, 7, 14, 15], [7, 14, 15, 16]):
                (logits, _), ok = ran_as_dispatched(seen, lambda: model(idx[:, a:b], caches=caches))
                assert ok, f"{impl} decoding tokens {a}..{b}"
                steps.append(logits)
        out[impl] = dict(loss=loss.item(), grads=[p.grad for p in model.parameters()], full=full,
                         stepped=torch.cat(steps, dim=1))
    t, s = out["triton"], out["sdpa"]
    assert abs(t["loss"] - s["loss"]) <= 1e-5
    assert max((a - b).abs().max().item() for a, b in zip(t["grads"], s["grads"])) <= 1e-4
    assert (t["full"] - s["full"]).abs().max().item() <= 1e-4
    assert (t["stepped"] - s["stepped"]).abs().max().item() <= 1e-4
    assert (t["stepped"] - t["full"]).abs().max().item() <= 1e-4
