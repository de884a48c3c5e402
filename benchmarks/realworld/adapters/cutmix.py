"""clovaai/CutMix-PyTorch: DataParallel(model).cuda() in main(), CutMix with a
torch.randperm(batch) partner and a random box per batch, loaders by dataset name,
checkpoint dict per epoch + shutil.copyfile to model_best."""
from adapters.common import cuda_on_cpu, edit, install_probe, install_stub


def adapt(root):
    install_stub(root, ".")
    install_probe(root, "train.py")
    cuda_on_cpu(root, "train.py")
    # newer torch: the transposed `correct` is not viewable (the usual accuracy() fix)
    edit(root, "train.py", ("correct_k = correct[:k].view(-1)", "correct_k = correct[:k].reshape(-1)"))
    edit(root, "train.py", ("np.int(", "int("), count=None)  # np.int: removed in numpy 1.24
