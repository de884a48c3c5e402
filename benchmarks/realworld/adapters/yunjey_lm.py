"""yunjey/pytorch-tutorial 02-intermediate/language_model: module-level script, corpus
batchified into a (batch, tokens) tensor, slices of seq_length by index (no DataLoader),
LSTM states carried and detached, sampling into sample.txt after training."""
from pathlib import Path

from adapters.common import edit, install_probe

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex".split()


def adapt(root):
    install_probe(root, "main.py")
    edit(root, "main.py", ("embed_size = 128", "embed_size = 16"), ("hidden_size = 1024", "hidden_size = 32"),
         ("num_epochs = 5", "num_epochs = 2"), ("num_samples = 1000", "num_samples = 100"),
         ("batch_size = 20", "batch_size = 4"), ("seq_length = 30", "seq_length = 10"))
    d = Path(root, "data")
    d.mkdir(exist_ok=True)
    lines = [" ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(12)) for i in range(40)]
    (d / "train.txt").write_text("\n".join(lines) + "\n")
