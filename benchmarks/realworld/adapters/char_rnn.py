"""spro/char-rnn.pytorch: no DataLoader (random chunks with `random`), one forward per
character before one backward, generate() samples through the model, whole model pickled."""
from pathlib import Path

from adapters.common import edit, install_probe, install_stub


def adapt(root):
    for name in ("tqdm", "unidecode"):
        install_stub(root, ".", name)
    install_probe(root, "train.py")
    edit(root, "train.py", ("loss.data[0]", "loss.item()"))  # pre-0.4 torch idiom
    # the original's off-by-one: randint is inclusive, so a chunk may start one character
    # too late and come out short (a shape error in about 1 run in 13 at this size)
    edit(root, "train.py", ("random.randint(0, file_len - chunk_len)", "random.randint(0, file_len - chunk_len - 1)"))
    Path(root, "tiny.txt").write_text("What a piece of work is a man, how noble in reason. " * 40)
