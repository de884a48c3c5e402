"""karpathy/minGPT projects/chargpt: Trainer class in a package (mingpt/trainer.py)
iterating `batch = next(data_iter)` over a RandomSampler(replacement=True, 1e10 samples)
until max_iters, optimizer from model.configure_optimizers(), a callback (closure over the
module-level model) that samples with model.generate and saves the state_dict."""
from pathlib import Path

from adapters.common import edit, install_probe

ENTRY = "projects/chargpt/chargpt.py"


def adapt(root):
    install_probe(root, ENTRY)
    edit(root, ENTRY, ("if trainer.iter_num % 500 == 0:", "if trainer.iter_num % 5 == 0:"),
         ("model.generate(x, 500,", "model.generate(x, 20,"))
    Path(root, "projects/chargpt/input.txt").write_text(
        "First Citizen: Before we proceed any further, hear me speak. O God, O God! " * 8)
