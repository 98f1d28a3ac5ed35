"""Plain torch.nn versions of zoo models, loaded with a gradcheck model's exact parameters.

These are what "bare torch" means in the benchmarks: the model written the
usual way (torchvision's ResNet-18 structure and names; an nn.Sequential
MLP), with no gradcheck code on the forward or backward path.  Names match
gradcheck's leaf paths, so ``load_from`` copies every parameter and buffer
by name and ``load_state_dict(strict=True)`` proves none is missing.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """torchvision.models.resnet18's structure and parameter names (torchvision is not needed)."""

    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes, stages = 64, []
        for planes, stride in zip((64, 128, 256, 512), (1, 2, 2, 2)):
            stages.append(nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes)))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def mlp(in_features=32, hidden=(64, 64), out_features=10):
    sizes = (in_features,) + tuple(hidden)
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(sizes[-1], out_features))


def load_from(module: nn.Module, gradcheck_model) -> nn.Module:
    """Copy every parameter and buffer of ``gradcheck_model`` into ``module`` by path (strict)."""
    state = {path: torch.from_numpy(np.array(value, copy=True)) for path, value, _ in gradcheck_model.named_arrays()}
    module.load_state_dict(state, strict=True)
    return module


def build(name: str, gradcheck_model) -> nn.Module:
    if name == "resnet18":
        return load_from(ResNet18(gradcheck_model.fc.weight.shape[0]), gradcheck_model).train()
    if name == "mlp":
        linears = [layer for layer in gradcheck_model.layers if hasattr(layer, "weight")]
        sizes = [linears[0].weight.shape[1]] + [layer.weight.shape[0] for layer in linears]
        return load_from(mlp(sizes[0], tuple(sizes[1:-1]), sizes[-1]), gradcheck_model).train()
    raise KeyError(f"no torch.nn version of {name!r} here")
