# expect: DDP306:42
# nanoGPT shape: the DDP model (with BatchNorm buffers) run under a rank-0 branch through a
# helper named estimate_loss; with grad enabled DDP's forward broadcasts buffers: rank 0 hangs.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def estimate_loss(net, loader):
    net.eval()
    total = 0.0
    for x, y in loader:
        total += torch.nn.functional.cross_entropy(net(x.cuda()), y.cuda()).item()
    net.train()
    return total / len(loader)


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    master_process = dist.get_rank() == 0
    data = TensorDataset(torch.randn(512, 32), torch.randint(0, 10, (512,)))
    val = TensorDataset(torch.randn(64, 32), torch.randint(0, 10, (64,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    val_loader = DataLoader(val, batch_size=16)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 10))
    model = DDP(net.cuda(), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(10):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if master_process:
            val_loss = estimate_loss(model, val_loader)
            print(f"epoch {epoch}: val loss {val_loss:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
