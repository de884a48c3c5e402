"""akamaster/pytorch_resnet_cifar10 trainer.py: DataParallel(model) then model.cuda() in
main(), global args, eval each epoch, checkpoint.th every --save-every epochs and
model.th every epoch, --resume PATH."""
from adapters.common import cuda_on_cpu, edit, install_probe, install_stub


def adapt(root):
    install_stub(root, ".")
    install_probe(root, "trainer.py")
    cuda_on_cpu(root, "trainer.py")
    # newer torch: a scheduler built with last_epoch >= 0 needs 'initial_lr' in the
    # param groups (the original's --resume stops here otherwise)
    edit(root, "trainer.py", (
        "    lr_scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer,",
        "    for _g in optimizer.param_groups:\n"
        "        _g.setdefault('initial_lr', _g['lr'])\n"
        "    lr_scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer,"))
