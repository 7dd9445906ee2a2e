"""train.py with a slow checkpoint write, for the kill-safety tests: every ckpt.pt/best.pt
write puts half its bytes in the temporary file, prints SAVING, sleeps, then writes the
rest, so a test can SIGKILL the run in the middle of a write."""
import io
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import train  # noqa: E402
import trainer.loop  # noqa: E402
from trainer.checkpoint import save_atomic  # noqa: E402

DELAY_S = float(os.environ.get("SLOW_SAVE_S", "1.0"))


def slow_writer(obj, f, name):
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    f.write(data[:len(data) // 2])
    f.flush()
    print(f"SAVING {name}", flush=True)
    time.sleep(DELAY_S)
    f.write(data[len(data) // 2:])


def slow_save(obj, path, writer=torch.save):
    if writer is torch.save:
        writer = lambda o, f: slow_writer(o, f, os.path.basename(path))  # noqa: E731
    save_atomic(obj, path, writer=writer)


trainer.loop.save_atomic = slow_save  # Trainer.save writes through it

if __name__ == "__main__":
    train.main(sys.argv[1:])
