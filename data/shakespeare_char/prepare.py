"""Tiny Shakespeare at the character level: train.bin, val.bin (uint16) and meta.json.

    python data/shakespeare_char/prepare.py                 # downloads input.txt
    python data/shakespeare_char/prepare.py --input FILE    # a local copy (offline, tests)

90/10 train/val split; the vocabulary is the sorted set of characters in the text, listed
in meta.json's `chars`. See data/__init__.py for the options and the details.
"""
import os
import runpy

# Registers the data package without editing sys.path; data/bootstrap.py says why (and why at top level).
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "bootstrap.py"))

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"

if __name__ == "__main__":
    from data import prepare_text

    prepare_text.main(__doc__, out_dir=os.path.dirname(os.path.abspath(__file__)), tokenizer="char",
                      val_fraction=0.1, url=URL)
