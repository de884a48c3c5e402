# expect: DDP307:32
# dist.all_reduce on a Python float (running_loss / n): not a tensor, so it raises at the end of
# the first epoch (and the value was never averaged). No dp2ddp code is meant for this; the
# closest is DDP307 (a shard's metric taken as agreed on).
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
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = DDP(torch.nn.Linear(32, 10).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(10):
        sampler.set_epoch(epoch)
        running_loss = 0.0
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
        epoch_loss = running_loss / len(loader)
        dist.all_reduce(epoch_loss)
        epoch_loss /= dist.get_world_size()
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {epoch_loss:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
