import torch.nn as nn


def _tiny(num_classes=1000, **kw):
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    m.fc = nn.Linear(8, num_classes)
    m.add_module("fc", m.fc)
    return m


def __getattr__(name):
    return _tiny


resnet18 = resnet34 = resnet50 = _tiny
