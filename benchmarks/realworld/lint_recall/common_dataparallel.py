# expect: DDP001:13
import torch
import torch.nn as nn
import torchvision
from torch.utils.data import DataLoader

device = torch.device("cuda")
train_set = torchvision.datasets.CIFAR10("data", train=True, download=True,
                                         transform=torchvision.transforms.ToTensor())
train_loader = DataLoader(train_set, batch_size=256, shuffle=True, num_workers=4)
model = torchvision.models.resnet18(num_classes=10)
if torch.cuda.device_count() > 1:
    model = nn.DataParallel(model)
model = model.to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(20):
    for x, y in train_loader:
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
torch.save(model.state_dict(), "model.pt")
