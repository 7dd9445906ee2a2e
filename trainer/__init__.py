"""The trainer's plumbing behind train.py: settings (every key), batches, checkpoints, run files."""
