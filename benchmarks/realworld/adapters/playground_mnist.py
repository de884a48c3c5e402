"""aaron-xichen/pytorch-playground mnist/: module-level train.py, `print` rebound to a
shared logger (utee/misc.py, FileHandler in logdir), DataParallel(device_ids=range(ngpu))
then .cuda() under `if args.cuda:`, loaders built in dataset.py (both shuffled),
misc.model_snapshot (another package: unwraps `isinstance(model, nn.DataParallel)`,
removes the previous best file, saves a state_dict) every epoch and on a better test
accuracy; the loop sits in try/except Exception that only prints the traceback."""
from adapters.common import edit, install_probe, install_stub


def adapt(root):
    for name in ("torchvision", "cv2", "IPython"):
        install_stub(root, "mnist", name)
    install_probe(root, "mnist/train.py")
    # the MLP (784-256-256-10) on CPU is small enough: keep it; one loader worker -> none
    edit(root, "mnist/train.py", ("num_workers=1", "num_workers=0"))
