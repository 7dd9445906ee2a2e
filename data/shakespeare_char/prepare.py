"""Tiny Shakespeare at the character level: train.bin, val.bin (uint16) and meta.json.

    python data/shakespeare_char/prepare.py                 # downloads input.txt
    python data/shakespeare_char/prepare.py --input FILE    # a local copy (offline, tests)

90/10 train/val split; the vocabulary is the sorted set of characters in the text, listed
in meta.json's `chars`. See data/common.py for the options and the details.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # data/: the shared common.py
import common  # noqa: E402

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"

if __name__ == "__main__":
    common.text_main(__doc__, out_dir=os.path.dirname(os.path.abspath(__file__)), tokenizer="char",
                     val_fraction=0.1, url=URL)
