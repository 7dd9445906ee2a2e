"""tools.reach: the receptive field equals where gradients reach in the built model (random weights,
float64), and the counts over hand-written MQAR rows equal the ones worked out by hand."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers import ROOT
from model import GPT, GPTConfig
from tools import reach

T = 16


def tiny(attention, n_layer=2, **keys):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=32, block_size=T, n_layer=n_layer, n_head=2, n_embd=16, attention=attention,
                         **keys)).double().eval()


ROW = torch.randint(0, 32, (1, T), generator=torch.Generator().manual_seed(1))


def gradient_support(model, idx=ROW):
    """bool (T, T): d logits[q] / d (token embedding j) is nonzero on the row idx (1, T)."""
    support = np.zeros((T, T), dtype=bool)
    for q in range(T):
        emb = model.wte(idx).detach().requires_grad_()
        hook = model.wte.register_forward_hook(lambda module, args, out: emb)
        logits, _ = model(idx)
        hook.remove()
        (logits[0, q] * torch.linspace(1, 2, 32, dtype=torch.float64)).sum().backward()
        support[q] = emb.grad[0].abs().sum(-1).numpy() > 0
    return support


@pytest.mark.parametrize("attention, n_layer, keys", [
    ("swa", 2, dict(sliding_window=3)),
    ("bigbird", 2, dict(sparse_block=4, sparse_window=1, sparse_global=1, sparse_random=0)),
    ("bigbird", 1, dict(sparse_block=4, sparse_window=1, sparse_global=1, sparse_random=1)),  # a random block
    ("mha", 2, {}),
    ("gla", 2, dict(gla_chunk=8)),
])
def test_receptive_field_is_where_gradients_reach(attention, n_layer, keys):
    model = tiny(attention, n_layer, **keys)
    field = reach.receptive_field(reach.layer_patterns(model, T))
    assert (field == gradient_support(model)).all()
    causal = (field == np.tri(T, dtype=bool)).all()
    assert not causal if attention in ("swa", "bigbird") else causal   # the sparse ones miss some earlier tokens


def test_moba_has_no_fixed_pattern_and_its_chosen_one_is_where_gradients_reach():
    """MoBA's choice carries no gradient, so on each row the gradients reach exactly the field of the
    blocks chosen there; two rows observed one per batch, each against its own gradients."""
    model = tiny("moba", sparse_block=4, moba_topk=1)
    assert reach.layer_patterns(model, T) is None
    rows = torch.cat([ROW, torch.randint(0, 32, (1, T), generator=torch.Generator().manual_seed(2))])
    fields = reach.receptive_field(reach.observed_patterns(model, rows, batch=1))
    for field, row in zip(fields, rows):
        assert (field == gradient_support(model, row[None])).all() and not (field == np.tri(T, dtype=bool)).all()
    assert not (fields[0] == fields[1]).all()   # content chose differently on the two rows


def write_rows(folder, rows):
    """rows: [(tokens, {position: answer})] of T tokens -> the split 'test' in data/mqar/prepare.py's files."""
    folder.mkdir()
    x = np.array([tokens for tokens, _ in rows], dtype=np.uint16)
    y = np.full(x.shape, -1, dtype=np.int32)
    for r, (_, answers) in enumerate(rows):
        for pos, value in answers.items():
            y[r, pos] = value
    x.tofile(folder / "test.bin")
    y.tofile(folder / "test.targets.bin")
    meta = {"vocab_size": 32, "row_len": T, "mqar": {"num_pairs": 2}}
    (folder / "meta.json").write_text(json.dumps(meta))


def test_counts_over_rows_written_by_hand(tmp_path):
    # keys 1, 2 with values 17, 18 at positions 0-3; filler 30; values come from [16, 32). Window 3,
    # 2 layers: a token reads itself and 2 back, so the field of q is q-4..q, the last layer alone q-2..q.
    f = 30
    rows = [
        # q 5 asks key 2 (k 2, v 3): in the field, read directly (5-3 = 2): 1
        # q 9 asks key 1 (k 0, v 1): the value is outside; the field holds the value-range token 30 only: 1/15
        ([1, 17, 2, 18, f, 2, f, f, f, 1, f, f, f, f, f, f], {5: 18, 9: 17}),
        # q 4 asks key 1 (k 0, v 1): in the field (4-0 = 4), not read directly (4-1 = 3 > 2): 1
        # q 6 asks key 2 (k 2, v 3): in the field, not read directly: 1
        ([1, 17, 2, 18, 1, f, 2, f, f, f, f, f, f, f, f, f], {4: 17, 6: 18}),
        # q 5 asks key 1: sees v 1 (pos 1) but not k 1 (pos 0); it sees k 2, so 17 is the only value whose
        # key it does not see: 1. q 14 asks key 2: sees 30 and its own key only: 1/15
        ([1, 17, 2, 18, f, 1, f, f, f, f, f, f, f, f, 2, f], {5: 17, 14: 18}),
    ]
    write_rows(tmp_path / "d", rows)
    got = reach.reach(tiny("swa", sliding_window=3), str(tmp_path / "d"), T)
    assert got == pytest.approx({"field": 3 / 6, "direct": 1 / 6, "ceiling": (4 + 2 / 15) / 6})
    # the same rows under causal attention: everything in reach
    assert reach.reach(tiny("mha"), str(tmp_path / "d"), T) == {"field": 1, "direct": 1, "ceiling": 1}
    # a content-chosen layer: nothing to count before training; observed, MoBA reading every block reaches all
    moba = tiny("moba", sparse_block=4, moba_topk=3)
    assert reach.reach(moba, str(tmp_path / "d"), T) == dict.fromkeys(("field", "direct", "ceiling"))
    assert reach.reach(moba, str(tmp_path / "d"), T, observe=True) == {"field": 1, "direct": 1, "ceiling": 1}


def test_cli_refuses_a_folder_without_mqar_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tools.reach", "config/recall/swa.py", "--data", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "has no meta.json" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
