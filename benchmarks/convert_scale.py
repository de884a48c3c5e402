"""How convert's time grows with the size of one file.

Generates one DataParallel training script of N lines (repeated blocks: a model
wrapped in DataParallel, a DataLoader, an epoch loop with backward/step, a
print and a torch.save), converts it as `dp2ddp convert FILE` does (the diff
mode: no fixed-point pass), and prints the seconds per 1,000 lines at each size
and the ratio to the smallest: a linear conversion keeps the ratio near 1.

    python benchmarks/convert_scale.py [--sizes 2500,5000,10000] [--profile N]

``--profile N`` runs cProfile on the N-line file instead and prints the top
functions by cumulative time.
"""

from __future__ import annotations

import argparse
import time

HEADER = """import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

"""

BLOCK = '''
class Net{i}(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def train_{i}(epochs=2, lr=0.1):
    model = Net{i}()
    if torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    model = model.cuda() if torch.cuda.is_available() else model
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    data = TensorDataset(torch.randn(64, 16), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    for epoch in range(epochs):
        total = 0.0
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item()
        print("model {i} epoch", epoch, total)
        torch.save(model.state_dict(), "net{i}.pt")
    return model
'''


def script(lines: int) -> str:
    """A training script of about ``lines`` lines (whole blocks)."""
    block_lines = BLOCK.count("\n")
    count = max(1, (lines - 10) // block_lines)
    body = "".join(BLOCK.format(i=i) for i in range(count))
    calls = "".join(f"    train_{i}()\n" for i in range(count))
    return HEADER + body + '\n\ndef main():\n' + calls + '\n\nif __name__ == "__main__":\n    main()\n'


def convert_once(text: str) -> float:
    from dp2ddp.engine import convert_sources

    started = time.perf_counter()
    (file,) = convert_sources({"train.py": text.encode()}, verify=False).files
    took = time.perf_counter() - started
    assert file.error is None and file.output is not None and b"DistributedDataParallel" in file.output, file.error
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2500,5000,10000", help="lines, comma-separated")
    parser.add_argument("--profile", type=int, default=0, help="profile one run of this many lines")
    parser.add_argument("--sort", default="cumulative", help="pstats order of the profile (tottime: own time)")
    args = parser.parse_args()
    import libcst  # noqa: F401  (imported before the clock starts)

    if args.profile:
        import cProfile
        import pstats

        text = script(args.profile)
        profile = cProfile.Profile()
        profile.runcall(convert_once, text)
        pstats.Stats(profile).sort_stats(args.sort).print_stats(40)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    base = None
    print(f"{'lines':>7} {'seconds':>8} {'s/1000 lines':>13} {'ratio':>6}")
    for size in sizes:
        text = script(size)
        lines = text.count("\n")
        took = convert_once(text)
        per_1000 = took / lines * 1000
        base = base or per_1000
        print(f"{lines:>7} {took:>8.2f} {per_1000:>13.3f} {per_1000 / base:>6.2f}")


if __name__ == "__main__":
    main()
