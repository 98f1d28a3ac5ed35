"""ResNet-18/34/50 exactly as torchvision builds them: names, shapes, buffers and init.

``resnet18()`` has 11,689,512 parameters in 62 trainable tensors
(``conv1.weight``, ``bn1.weight``, ``layer1.0.conv1.weight``,
``layer2.0.downsample.0.weight``, ``fc.bias`` ...); BatchNorm running
statistics and ``num_batches_tracked`` are buffers.  Init as torchvision:
convolutions kaiming_normal (fan_out, relu), BatchNorm weight 1 and bias 0,
``fc`` the default Linear init.  The global average pool makes the model
work at any input size of at least 32x32 (five halvings).
"""

from __future__ import annotations

from typing import Any

from gradcheck import ops
from gradcheck.layers import init
from gradcheck.layers.activations import ReLU
from gradcheck.layers.conv import Conv2d
from gradcheck.layers.core import Chain, Linear
from gradcheck.layers.norm import BatchNorm2d
from gradcheck.layers.pool import AdaptiveAvgPool2d, MaxPool2d
from gradcheck.module import Module, child


def conv(in_planes, out_planes, kernel, stride=1, rng=None):
    """A bias-free convolution with torchvision's ResNet init (padding keeps the size at stride 1)."""
    return Conv2d(in_planes, out_planes, kernel, stride=stride, padding=kernel // 2, bias=False, rng=rng,
                  weight_init=init.kaiming_normal_fan_out)


class BasicBlock(Module):
    """Two 3x3 convolutions with a residual; the stride sits on the first (ResNet-18/34)."""

    conv1: Any = child()
    bn1: Any = child()
    conv2: Any = child()
    bn2: Any = child()
    downsample: Any = child()

    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None, rng=None):
        self.conv1, self.bn1 = conv(inplanes, planes, 3, stride, rng), BatchNorm2d(planes)
        self.conv2, self.bn2 = conv(planes, planes, 3, 1, rng), BatchNorm2d(planes)
        self.downsample = downsample

    def last_bn(self):
        return self.bn2

    def __call__(self, x):
        out = ops.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return ops.relu(out + identity)


class Bottleneck(Module):
    """1x1 reduce, 3x3 (carrying the stride, torchvision's "v1.5"), 1x1 expand by 4 (ResNet-50)."""

    conv1: Any = child()
    bn1: Any = child()
    conv2: Any = child()
    bn2: Any = child()
    conv3: Any = child()
    bn3: Any = child()
    downsample: Any = child()

    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None, rng=None):
        self.conv1, self.bn1 = conv(inplanes, planes, 1, 1, rng), BatchNorm2d(planes)
        self.conv2, self.bn2 = conv(planes, planes, 3, stride, rng), BatchNorm2d(planes)
        self.conv3, self.bn3 = conv(planes, planes * 4, 1, 1, rng), BatchNorm2d(planes * 4)
        self.downsample = downsample

    def last_bn(self):
        return self.bn3

    def __call__(self, x):
        out = ops.relu(self.bn1(self.conv1(x)))
        out = ops.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return ops.relu(out + identity)


class ResNet(Module):
    conv1: Any = child()
    bn1: Any = child()
    relu: Any = child()
    maxpool: Any = child()
    layer1: list = child()
    layer2: list = child()
    layer3: list = child()
    layer4: list = child()
    avgpool: Any = child()
    fc: Any = child()

    def __init__(self, block, layers, num_classes=1000, zero_init_residual=False, rng=None):
        rng = init.get_rng(rng)
        self.conv1 = conv(3, 64, 7, 2, rng)
        self.bn1, self.relu, self.maxpool = BatchNorm2d(64), ReLU(), MaxPool2d(3, 2, 1)
        inplanes = 64
        stages = []
        for planes, blocks, stride in zip((64, 128, 256, 512), layers, (1, 2, 2, 2)):
            downsample = None
            if stride != 1 or inplanes != planes * block.expansion:
                downsample = Chain(conv(inplanes, planes * block.expansion, 1, stride, rng),
                                   BatchNorm2d(planes * block.expansion))
            stage = [block(inplanes, planes, stride, downsample, rng=rng)]
            inplanes = planes * block.expansion
            stage += [block(inplanes, planes, rng=rng) for _ in range(1, blocks)]
            stages.append(stage)
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = AdaptiveAvgPool2d(1)
        self.fc = Linear(512 * block.expansion, num_classes, rng=rng)
        if zero_init_residual:  # torchvision's option: each block starts as the identity
            for stage in stages:
                for b in stage:
                    b.last_bn().weight = b.last_bn().weight * 0

    def __call__(self, x):
        shape = ops.shape_of(x)
        if len(shape) != 4 or shape[1] != 3:
            raise ValueError(f"ResNet: input of shape {shape}; expected (N, 3, H, W) with H, W >= 32")
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            for b in stage:
                x = b(x)
        return self.fc(ops.flatten(self.avgpool(x), 1))


def resnet18(num_classes=1000, zero_init_residual=False, rng=None):
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes, zero_init_residual, rng=rng)


def resnet34(num_classes=1000, zero_init_residual=False, rng=None):
    return ResNet(BasicBlock, (3, 4, 6, 3), num_classes, zero_init_residual, rng=rng)


def resnet50(num_classes=1000, zero_init_residual=False, rng=None):
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes, zero_init_residual, rng=rng)


def normal_inputs(rng, batch, input_shape, **_):
    """Standard-normal inputs: features, or images (what a normalised ImageNet batch looks like to a network)."""
    return (rng.standard_normal((batch,) + tuple(input_shape)),)
