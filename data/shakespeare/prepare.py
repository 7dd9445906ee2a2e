"""Tiny Shakespeare in GPT-2 BPE tokens (tiktoken's gpt2): train.bin, val.bin (uint16) and meta.json.

    python data/shakespeare/prepare.py                  # downloads input.txt next to the output
    python data/shakespeare/prepare.py --input FILE     # a local copy (offline, tests)
    python train.py config/shakespeare_gpt2.py          # then train on it (or any variant: --dataset=shakespeare)

The whole text is one document (followed by <|endoftext|>); the last 10% of it is the
validation split, cut at a line break so that the tokens are those of the whole text.
--tokenizer picks another tiktoken encoding (or char); see data/__init__.py for the details.
"""
import os
import runpy

# Registers the data package without editing sys.path; data/bootstrap.py says why (and why at top level).
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "bootstrap.py"))

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"

if __name__ == "__main__":
    from data import prepare_text

    prepare_text.main(__doc__, out_dir=os.path.dirname(os.path.abspath(__file__)), tokenizer="gpt2",
                      val_fraction=0.1, url=URL)
