"""spro/char-rnn.pytorch: no DataLoader (random chunks with `random`), one forward per
character before one backward, generate() samples through the model, whole model pickled."""
from pathlib import Path

from adapters.common import edit, install_probe, install_stub


def adapt(root):
    for name in ("tqdm", "unidecode"):
        install_stub(root, ".", name)
    install_probe(root, "train.py")
    edit(root, "train.py", ("loss.data[0]", "loss.item()"))  # pre-0.4 torch idiom
    Path(root, "tiny.txt").write_text("What a piece of work is a man, how noble in reason. " * 40)
