# expect: DDP102:16
# set_epoch is called once, before the epoch loop: every epoch replays epoch 0's order.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    data = TensorDataset(torch.randn(512, 32), torch.randint(0, 10, (512,)))
    train_sampler = DistributedSampler(data, shuffle=True)
    train_loader = DataLoader(data, batch_size=16, sampler=train_sampler)
    model = DDP(torch.nn.Linear(32, 10).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_sampler.set_epoch(0)
    for epoch in range(30):
        for x, y in train_loader:
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
