"""dome272/Diffusion-Models-pytorch ddpm_conditional.py: single-device script (no
DataParallel), conditional UNet whose label embedding is skipped for 10% of the batches
(np.random), EMA copy made with copy.deepcopy(model) and refreshed by
ema_model.load_state_dict(model.state_dict()), classifier-free-guidance sampling through
both models every 10 epochs, images saved by utils.save_images, three torch.save's;
hyper-parameters set in launch(); loader in utils.get_data."""
from adapters.common import edit, install_probe, install_stub, sub


def adapt(root):
    for name in ("torchvision", "tqdm", "rw_tb", "PIL", "matplotlib"):
        install_stub(root, ".", name)
    install_probe(root, "ddpm_conditional.py")
    edit(root, "ddpm_conditional.py",
         ("from torch.utils.tensorboard import SummaryWriter", "from rw_tb import SummaryWriter"),
         ("args.epochs = 300", "args.epochs = 1"),
         ("args.batch_size = 14", "args.batch_size = 4"),
         # the UNet's time encoding is built on its own `device` argument (default "cuda")
         ("UNet_conditional(num_classes=args.num_classes)",
          "UNet_conditional(num_classes=args.num_classes, device=device)"),
         ("Diffusion(img_size=args.image_size, device=device)",
          "Diffusion(noise_steps=4, img_size=args.image_size, device=device)"))
    # 16x16 images instead of 64x64: the UNet's self-attention layers are built for
    # fixed sizes (64 / 2**k)
    edit(root, "ddpm_conditional.py", ("args.image_size = 64", "args.image_size = 16"))
    edit(root, "modules.py", *[(f"self.sa{i} = SelfAttention({c}, {s})",
                                f"self.sa{i} = SelfAttention({c}, {s // 4})")
                               for i, c, s in ((1, 128, 32), (2, 256, 16), (3, 256, 8),
                                               (4, 128, 16), (5, 64, 32), (6, 64, 64))],
         count=2)  # UNet and UNet_conditional
    sub(root, "ddpm_conditional.py", r'^    args\.device = "cuda".*$', '    args.device = "cpu"')
