# expect: DDP102:17
# set_epoch is called on the validation sampler only; the training sampler never reshuffles.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    train_set = TensorDataset(torch.randn(512, 32), torch.randint(0, 10, (512,)))
    val_set = TensorDataset(torch.randn(128, 32), torch.randint(0, 10, (128,)))
    train_sampler = DistributedSampler(train_set, shuffle=True)
    val_sampler = DistributedSampler(val_set, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=16, sampler=train_sampler)
    val_loader = DataLoader(val_set, batch_size=16, sampler=val_sampler)
    model = DDP(torch.nn.Linear(32, 10).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(30):
        val_sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.cuda())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
