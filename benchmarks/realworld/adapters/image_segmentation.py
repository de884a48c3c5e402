"""LeeJunHyun/Image_Segmentation: Solver class in solver.py, one get_loader() factory for
train/valid/test, hyper-parameters (epochs, lr) drawn with `random` at start-up,
best model saved by validation score, result.csv appended."""
from adapters.common import edit, install_probe, install_stub

SYNTH = ("dataset = data.TensorDataset(torch.rand(int(os.environ.get('RW_N', '16')), 3, image_size, image_size), "
         "(torch.rand(int(os.environ.get('RW_N', '16')), 1, image_size, image_size) > 0.5).float())")


def adapt(root):
    install_stub(root, ".")
    install_probe(root, "main.py")
    edit(root, "data_loader.py", ("from PIL import Image\n", ""),
         ("dataset = ImageFolder(root = image_path, image_size =image_size, mode=mode,augmentation_prob=augmentation_prob)",
          SYNTH))
    # an untrained net on random masks scores 0: let the first epoch count as the best
    edit(root, "solver.py", ("best_unet_score = 0.\n", "best_unet_score = -1.\n"))
    edit(root, "main.py", ("random.choice([100,150,200,250])", "random.choice([2,3])"))
