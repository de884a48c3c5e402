# expect: DDP203:39
# Accumulation where backward() runs inside a GradScaler helper (timm/MAE NativeScaler shape).
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class NativeScaler:
    def __init__(self):
        self._scaler = torch.cuda.amp.GradScaler()

    def __call__(self, loss, optimizer, update_grad=True):
        self._scaler.scale(loss).backward()
        if update_grad:
            self._scaler.step(optimizer)
            self._scaler.update()
            optimizer.zero_grad()


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    data = TensorDataset(torch.randn(512, 32), torch.randint(0, 10, (512,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = DDP(torch.nn.Linear(32, 10).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_scaler = NativeScaler()
    accum_iter = 8
    for epoch in range(10):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            with torch.autocast("cuda"):
                loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()) / accum_iter
            loss_scaler(loss, optimizer, update_grad=(i + 1) % accum_iter == 0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
