"""train.py's parts: settings (every key), startup (the checks before any work), build (ranks, model,
optimizer), loop (Trainer and the loop), batches, checkpoints, run files; and cli, the command-line
helpers (config files, one-line errors) that the root scripts and tools/ import."""
