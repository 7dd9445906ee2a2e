"""Tiny Shakespeare in GPT-2 BPE tokens (tiktoken's gpt2): train.bin, val.bin (uint16) and meta.json.

    python data/shakespeare/prepare.py                  # downloads input.txt next to the output
    python data/shakespeare/prepare.py --input FILE     # a local copy (offline, tests)
    python train.py config/shakespeare_gpt2.py          # then train on it (or any variant: --dataset=shakespeare)

The whole text is one document (followed by <|endoftext|>); the last 10% of it is the
validation split, cut at a line break so that the tokens are those of the whole text.
--tokenizer picks another tiktoken encoding (or char); see data/common.py for the details.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # data/: the shared common.py
import common  # noqa: E402

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"

if __name__ == "__main__":
    common.text_main(__doc__, out_dir=os.path.dirname(os.path.abspath(__file__)), tokenizer="gpt2",
                     val_fraction=0.1, url=URL)
