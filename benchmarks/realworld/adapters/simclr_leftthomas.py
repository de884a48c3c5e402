"""leftthomas/SimCLR: CUDA-only module-level training (bare .cuda()), NT-Xent mask built
from the global batch_size (torch.eye(2 * batch_size)), kNN monitor over a memory-bank
loader, pandas CSV of statistics each epoch, best-by-accuracy state_dict."""
from adapters.common import cuda_on_cpu, edit, install_probe, install_stub


def adapt(root):
    for name in ("torchvision", "tqdm", "thop", "pandas", "PIL"):
        install_stub(root, ".", name)
    install_probe(root, "main.py")
    cuda_on_cpu(root, "main.py")
    edit(root, "main.py", ("num_workers=16", "num_workers=0"), count=3)
    # small encoder: the stub's tiny resnet50 gives 8 features (conv 3->8, pool, flatten)
    edit(root, "model.py", ("from torchvision.models.resnet import resnet50",
                            "from torchvision.models import resnet50"),
         ("nn.Linear(2048, 512, bias=False), nn.BatchNorm1d(512)",
          "nn.Linear(8, 16, bias=False), nn.BatchNorm1d(16)"),
         ("nn.Linear(512, feature_dim, bias=True)", "nn.Linear(16, feature_dim, bias=True)"))
