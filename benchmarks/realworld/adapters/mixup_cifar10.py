"""facebookresearch/mixup-cifar10: DataParallel under `if use_cuda:`, whole model pickled
in the checkpoint with the RNG state, csv log appended every epoch, --resume."""
from adapters.common import edit, install_probe, install_stub, trust_pickles


def adapt(root):
    install_stub(root, ".")
    install_probe(root, "train.py")
    trust_pickles(root, "train.py")
    edit(root, "train.py", ("num_workers=8", "num_workers=0"), count=2)
    edit(root, "train.py", ("loss.data[0]", "loss.item()"), count=2)  # pre-0.4 torch idiom
    edit(root, "utils.py", ("_, term_width = os.popen('stty size', 'r').read().split()",
                            "term_width = '80'"))
