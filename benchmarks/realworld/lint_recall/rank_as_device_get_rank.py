# expect: DDP004:11
# dist.get_rank() kept in a variable named gpu and used as the device index.
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("nccl", init_method="env://")
    gpu = dist.get_rank()
    device = torch.device("cuda", gpu)
    model = DDP(torch.nn.Linear(32, 10).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(100):
        loss = model(torch.randn(16, 32, device=device)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
