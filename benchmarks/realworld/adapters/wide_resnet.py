"""meliketoy/wide-resnet.pytorch: DataParallel under `if use_cuda:`, config module, best-model pickle."""
from adapters.common import edit, install_probe, install_stub, trust_pickles


def adapt(root):
    install_stub(root, ".")
    install_probe(root, "main.py")
    trust_pickles(root, "main.py")
    edit(root, "config.py", ("num_epochs = 200", "num_epochs = 2"))
    edit(root, "main.py", ("num_workers=2", "num_workers=0"), count=2)
