"""kuangliu/pytorch-cifar: module-level DataParallel CIFAR script, resume."""
from adapters.common import edit, install_probe, install_stub


def adapt(root):
    install_stub(root, ".")
    install_probe(root, "main.py")
    edit(root, "main.py",
         ("net = SimpleDLA()", "net = LeNet()"),
         ("start_epoch+200", "start_epoch+2"))
    edit(root, "main.py", ("num_workers=2", "num_workers=0"), count=2)
    # progress_bar asks the terminal for its width
    edit(root, "utils.py", ("_, term_width = os.popen('stty size', 'r').read().split()",
                            "term_width = '80'"))
