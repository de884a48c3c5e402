"""pytorch/examples word_language_model: a token tensor batchified into columns and cut
into bptt chunks by index (no DataLoader), LSTM hidden state carried across batches,
gradient clipping, best-by-validation `torch.save(model)` then reloaded for the test."""
from pathlib import Path

from adapters.common import install_probe

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex".split()


def adapt(root):
    install_probe(root, "main.py")
    d = Path(root, "data", "wikitext-2")
    d.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.txt", 60), ("valid.txt", 12), ("test.txt", 12)):
        lines = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(10)) for i in range(n)]
        (d / name).write_text("\n".join(lines) + "\n")
