"""OpenWebText in GPT-2 BPE tokens, streamed from the Hugging Face Hub: train.bin, val.bin, meta.json.

    python data/openwebtext/prepare.py                                 # all of it: ~9B tokens, ~18 GB
    python data/openwebtext/prepare.py --max_tokens=1e8 --num_proc=8   # a 100M-token slice
    python data/openwebtext/prepare.py --input owt/                    # local parquet/jsonl files
    torchrun --standalone --nproc_per_node=8 train.py config/owt_gpt2_124m.py

Every document is followed by <|endoftext|>; 0.05% of the documents (as in nanoGPT; a seeded
draw per document) form the validation split. Streaming needs no copy of the dataset on disk; an
interrupted run (Ctrl-C, a dropped connection) resumes where it stopped when run again with
the same options. Any text dataset works the same way: --dataset, --name, --split,
--text_field, --val_split (see --help and data/__init__.py).
"""
import os
import runpy

# Registers the data package without editing sys.path; data/bootstrap.py says why (and why at top level).
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "bootstrap.py"))

if __name__ == "__main__":
    from data import prepare_hf

    prepare_hf.main(__doc__, dataset="Skylion007/openwebtext", split="train", val_fraction=0.0005,
                    out_dir=os.path.dirname(os.path.abspath(__file__)))
