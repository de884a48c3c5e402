"""yjn870/SRCNN-pytorch: super-resolution, module-level `if __name__ == '__main__':`
script, h5py-backed datasets (stubs/h5py), optimizer param groups per submodule
(model.conv1.parameters(), a smaller lr for conv3), per-epoch state_dict saves, best
weights kept as a deepcopy of state_dict and saved at the end, batch-1 evaluation."""
from adapters.common import install_probe, install_stub


def adapt(root):
    for name in ("tqdm", "h5py"):
        install_stub(root, ".", name)
    install_probe(root, "train.py")
