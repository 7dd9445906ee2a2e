"""FineWeb-Edu (sample-10BT) in GPT-2 BPE tokens, streamed from the Hugging Face Hub.

    python data/fineweb/prepare.py --max_tokens=1e9              # a 1B-token slice (~2 GB)
    python data/fineweb/prepare.py                               # all of sample-10BT: ~10B tokens, ~20 GB
    python data/fineweb/prepare.py --name=sample-100BT --max_tokens=2e10
    python train.py config/fineweb_gpt2.py

Every document is followed by <|endoftext|>; 0.05% of the documents (a seeded draw) form the
validation split. Interrupted runs resume when run again with the same options. Same options
as data/openwebtext/prepare.py (see --help and data/__init__.py).
"""
import os
import runpy

# Registers the data package without editing sys.path; data/bootstrap.py says why (and why at top level).
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "bootstrap.py"))

if __name__ == "__main__":
    from data import prepare_hf

    prepare_hf.main(__doc__, dataset="HuggingFaceFW/fineweb-edu", name="sample-10BT", split="train",
                    val_fraction=0.0005, out_dir=os.path.dirname(os.path.abspath(__file__)))
