"""Constants and helpers shared by the tests (fixtures live in conftest.py)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

ATTENTIONS = {"mha": 0, "gqa": 2, "mqa": 0}   # attention -> n_kv_head (0 = implied)
POS_ENCODINGS = ("rope", "alibi", "learned", "none")


def tiny_model_kwargs(**overrides):
    kw = dict(block_size=32, vocab_size=65, n_layer=2, n_head=4, n_embd=32, dropout=0.0, bias=False)
    kw.update(overrides)
    return kw


def train_args(data_root, out_dir, *extra):
    """Overrides for a tiny CPU run on the prepared data."""
    return [os.path.join(ROOT, "config/base_shakespeare_char.py"), f"--data_dir={data_root}",
            f"--out_dir={out_dir}", "--device=cpu", "--n_layer=2", "--n_head=4", "--n_embd=32",
            "--block_size=32", "--batch_size=8", "--eval_iters=5", "--log_interval=10",
            "--warmup_iters=5", "--learning_rate=1e-2", "--lr_decay_iters=100", *extra]
