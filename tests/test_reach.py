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
    """MoBA's choice carries no gradient, so the gradients reach exactly the field of the blocks chosen."""
    model = tiny("moba", sparse_block=4, moba_topk=1)
    assert reach.layer_patterns(model, T) is None
    field = reach.receptive_field(reach.observed_patterns(model, ROW))[0]
    assert (field == gradient_support(model)).all() and not (field == np.tri(T, dtype=bool)).all()


def test_moba_reading_every_block_reaches_every_pair(tmp_path):
    write_rows(tmp_path / "d", [([1, 17, 2, 18] + [30] * 8 + [2, 30, 1, 30], {12: 18, 14: 17})])
    model = tiny("moba", sparse_block=4, moba_topk=3)
    assert reach.reach(model, str(tmp_path / "d"), T, pairs=2) == dict.fromkeys(("field", "direct", "ceiling"))
    assert reach.reach(model, str(tmp_path / "d"), T, pairs=2, observe=True) == {"field": 1, "direct": 1, "ceiling": 1}


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
    # keys 1, 2 with values 17, 18 at positions 0-3; filler 30. Window 3, 2 layers: a token reads
    # itself and 2 back, so the field of q reaches q-4; the last layer alone q-2.
    f = 30
    rows = [
        # query key 2 at 5: k at 2, v at 3 -> in the field (5-2 = 3 <= 4), read directly (5-3 = 2)
        # query key 1 at 9: k at 0 -> outside; pair 2 (k 2, v 3) outside too: ceiling 1/2
        ([1, 17, 2, 18, f, 2, f, f, f, 1, f, f, f, f, f, f], {5: 18, 9: 17}),
        # query key 1 at 4: k at 0, v at 1 -> in the field (4-0 = 4), not direct (4-1 = 3 > 2)
        # query key 2 at 6: k at 2, v at 3 -> in the field (6-2 = 4), not direct (6-3 = 3)
        ([1, 17, 2, 18, 1, f, 2, f, f, f, f, f, f, f, f, f], {4: 17, 6: 18}),
    ]
    write_rows(tmp_path / "d", rows)
    got = reach.reach(tiny("swa", sliding_window=3), str(tmp_path / "d"), T, pairs=2)
    assert got == pytest.approx({"field": 3 / 4, "direct": 1 / 4, "ceiling": (1 + 0.5 + 1 + 1) / 4})
    # the same rows under causal attention: everything in reach
    assert reach.reach(tiny("mha"), str(tmp_path / "d"), T, pairs=2) == {"field": 1, "direct": 1, "ceiling": 1}


def test_cli_refuses_a_folder_without_mqar_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tools.reach", "config/recall/swa.py", "--data", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "has no meta.json" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
