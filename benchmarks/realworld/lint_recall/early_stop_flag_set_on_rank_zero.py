# expect: DDP305:42
# Early stopping decided on rank 0 only; the break is outside the rank branch, so only rank 0
# leaves the loop and the others hang in their next backward().
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    rank = dist.get_rank()
    data = TensorDataset(torch.randn(512, 32), torch.randint(0, 10, (512,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = DDP(torch.nn.Linear(32, 10).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    best, bad_epochs, patience = float("inf"), 0, 3
    for epoch in range(100):
        sampler.set_epoch(epoch)
        total = torch.zeros(1, device="cuda")
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.detach()
        dist.all_reduce(total)
        should_stop = False
        if rank == 0:
            mean = total.item() / dist.get_world_size()
            if mean < best:
                best, bad_epochs = mean, 0
            else:
                bad_epochs += 1
            should_stop = bad_epochs >= patience
        if should_stop:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
