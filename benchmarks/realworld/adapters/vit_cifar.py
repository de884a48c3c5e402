"""kentaroy47/vision-transformers-cifar10 train_cifar10.py: module-level script,
DataParallel only `if 'cuda' in device` and --dp, unconditional net.cuda() before the
loop, AMP GradScaler + autocast, wandb (always on: `usewandb = ~args.nowandb`),
best-acc checkpoint with optimizer+scaler state in test(), log .txt appended and .csv
rewritten each epoch, --resume."""
from adapters.common import cuda_on_cpu, edit, install_probe, install_stub


def adapt(root):
    for name in ("torchvision", "wandb", "pandas", "einops", "timm", "PIL"):
        install_stub(root, ".", name)
    install_probe(root, "train_cifar10.py")
    cuda_on_cpu(root, "train_cifar10.py")
    edit(root, "train_cifar10.py", ("num_workers=8", "num_workers=0"), count=2)
