# expect: DDP109:34
# Distributed evaluation: DistributedSampler pads the val set to a multiple of the world size,
# so the averaged accuracy counts the repeated samples (the --dist_eval shape).
# DDP109 (padded-evaluation-shards) is meant for it.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    correct = torch.zeros(1, device="cuda")
    seen = torch.zeros(1, device="cuda")
    for x, y in loader:
        pred = model(x.cuda()).argmax(1)
        correct += (pred == y.cuda()).sum()
        seen += y.numel()
    dist.all_reduce(correct)
    dist.all_reduce(seen)
    return (correct / seen).item()


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    train_set = TensorDataset(torch.randn(512, 32), torch.randint(0, 10, (512,)))
    val_set = TensorDataset(torch.randn(1001, 32), torch.randint(0, 10, (1001,)))
    train_sampler = DistributedSampler(train_set, shuffle=True)
    val_sampler = DistributedSampler(val_set, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=16, sampler=train_sampler)
    val_loader = DataLoader(val_set, batch_size=16, sampler=val_sampler)
    model = DDP(torch.nn.Linear(32, 10).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(10):
        train_sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        acc = evaluate(model, val_loader)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: val acc {acc:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
