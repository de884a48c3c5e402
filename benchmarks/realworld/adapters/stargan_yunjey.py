"""yunjey/stargan: StarGAN (GAN with a domain-classification head), single-GPU, a
trainer class in solver.py (Solver builds G and D with their Adams, train() fetches
batches with iter()/next() and re-iter() on exhaustion, D step with three D forwards and
a gradient penalty, G step every n_critic iterations with two G forwards, sample
images from a fixed batch, checkpoints of G and D every model_save_step, --resume_iters);
the loader is built in data_loader.get_loader() and handed to Solver by main.py."""
from adapters.common import append, install_probe, install_stub

DATA = '''


class CelebA(CelebA):
    """rw harness: RW_N random images (RW_SHAPE, default 3x32x32) with random boolean
    attribute labels; no attribute file, no image folder."""

    def __init__(self, image_dir, attr_path, selected_attrs, transform, mode):
        n = int(os.environ.get("RW_N", "32"))
        shape = tuple(int(v) for v in os.environ.get("RW_SHAPE", "3,32,32").split(","))
        g = torch.Generator().manual_seed(1 if mode == "train" else 2)
        self.img = torch.rand((n,) + shape, generator=g) * 2 - 1
        self.lab = (torch.rand(n, len(selected_attrs), generator=g) > 0.5).float()
        self.transform, self.mode, self.num_images = transform, mode, n

    def __getitem__(self, index):
        return self.transform(self.img[index]), self.lab[index]
'''


def adapt(root):
    for name in ("torchvision", "PIL"):
        install_stub(root, ".", name)
    install_probe(root, "main.py")
    append(root, "data_loader.py", DATA)
