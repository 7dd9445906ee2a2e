"""The model trained with attn_impl=triton follows attn_impl=sdpa loss for loss (fp32).

On CPU the kernel runs under the Triton interpreter (conftest sets TRITON_INTERPRET=1)."""
import os
import subprocess
import sys

import pytest
import torch

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
