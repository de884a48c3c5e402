"""pytorch/examples time_sequence_prediction: no DataLoader (the whole sine-wave tensor
loaded with torch.load), LBFGS with a closure that runs forward/backward several times per
step, LSTMCell unrolled in forward with a `future` argument, matplotlib plots per step."""
from pathlib import Path

import numpy as np
import torch

from adapters.common import edit, install_probe, install_stub, trust_pickles


def adapt(root):
    install_stub(root, ".", "matplotlib")
    install_probe(root, "train.py")
    edit(root, "train.py", ("future = 1000", "future = 20"))
    # generate_sine_wave.py, smaller (N series of L points)
    rng = np.random.RandomState(2)
    T, L, N = 20, 60, 12
    x = np.empty((N, L), "int64")
    x[:] = np.array(range(L)) + rng.randint(-4 * T, 4 * T, N).reshape(N, 1)
    with open(Path(root, "traindata.pt"), "wb") as f:
        torch.save(np.sin(x / 1.0 / T).astype("float64"), f)
    trust_pickles(root, "train.py")  # the data is a pickled numpy array
