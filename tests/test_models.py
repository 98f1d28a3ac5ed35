"""The model zoo: ResNet's torchvision structure and counts, and every model's forward and tape gradients."""

from __future__ import annotations

import numpy as np
import pytest

import gradcheck
from gradcheck import ops
from gradcheck.case import cast_floats, materialise
from gradcheck.layers.models import MODELS, get_model, resnet18, resnet50


# torchvision's resnet18 parameter names, in named_parameters() order, written out from its
# source (conv1, bn1, layer1..4 of BasicBlocks, each stage after the first opening with a
# 1x1 conv + BN downsample, fc) so the check does not depend on torchvision being installed.
def torchvision_resnet18_names():
    names = ["conv1.weight", "bn1.weight", "bn1.bias"]
    for stage in range(1, 5):
        for block in range(2):
            p = f"layer{stage}.{block}"
            names += [f"{p}.conv1.weight", f"{p}.bn1.weight", f"{p}.bn1.bias",
                      f"{p}.conv2.weight", f"{p}.bn2.weight", f"{p}.bn2.bias"]
            if stage > 1 and block == 0:
                names += [f"{p}.downsample.0.weight", f"{p}.downsample.1.weight", f"{p}.downsample.1.bias"]
    return names + ["fc.weight", "fc.bias"]


@pytest.fixture(scope="module")
def r18():
    return resnet18(rng=0)


def test_resnet18_parameter_count_names_and_buffers(r18):
    params = r18.named_parameters()
    assert sum(int(np.size(v)) for _, v in params) == 11_689_512
    assert len(params) == 62
    assert [p for p, _ in params] == torchvision_resnet18_names()
    shapes = dict((p, np.shape(v)) for p, v in params)
    assert shapes["conv1.weight"] == (64, 3, 7, 7)
    assert shapes["layer2.0.downsample.0.weight"] == (128, 64, 1, 1)
    assert shapes["fc.weight"] == (1000, 512) and shapes["fc.bias"] == (1000,)
    buffers = [p for p, _, k in r18.named_arrays() if k == "buffer"]
    assert len(buffers) == 20 * 3  # 20 BatchNorms, each running_mean, running_var, num_batches_tracked
    assert {"bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked",
            "layer4.1.bn2.running_var", "layer3.0.downsample.1.running_mean"} <= set(buffers)


def test_resnet18_torchvision_init(r18):
    w = r18.conv1.weight  # kaiming_normal_, mode="fan_out", relu: std sqrt(2 / (64 * 49))
    assert abs(w.std() / np.sqrt(2 / (64 * 49)) - 1) < 0.05
    assert (r18.bn1.weight == 1).all() and (r18.bn1.bias == 0).all()
    assert np.abs(r18.fc.weight).max() <= 1 / np.sqrt(512)  # default Linear init
    assert r18.layer1[0].downsample is None and r18.layer2[0].downsample is not None


def test_other_resnets_counts():
    assert MODELS["resnet34"].build(0).num_parameters() == 21_797_672
    r50 = resnet50(rng=0)
    assert r50.num_parameters() == 25_557_032 and len(r50.named_parameters()) == 161
    assert np.shape(r50.layer1[0].conv3.weight) == (256, 64, 1, 1)
    assert np.shape(r50.layer2[0].conv2.weight) == (128, 128, 3, 3)  # v1.5: the stride is on the 3x3


def test_resnet18_matches_a_torch_resnet18_with_the_same_weights(r18):
    torch = pytest.importorskip("torch")
    theirs = _torch_resnet(torch, (2, 2, 2, 2)).double()
    ours = cast_floats(r18, np.float64)
    assert [(p, tuple(np.shape(v))) for p, v, _ in ours.named_arrays()] == \
        [(p, tuple(v.shape)) for p, v in theirs.state_dict().items()]
    theirs.load_state_dict({p: torch.as_tensor(np.asarray(v)) for p, v, _ in ours.named_arrays()})
    x = np.random.default_rng(1).standard_normal((2, 3, 32, 32))
    for mode in ("train", "eval"):
        ours.train(mode == "train")
        theirs.train(mode == "train")
        y = ours(x)
        ty = theirs(torch.as_tensor(x)).detach().numpy()
        np.testing.assert_allclose(y, ty, rtol=1e-9, atol=1e-10, err_msg=f"resnet18 forward in {mode} mode")
    np.testing.assert_allclose(ours.layer4[1].bn2.running_var, theirs.layer4[1].bn2.running_var.numpy(), rtol=1e-9)


def _torch_resnet(torch, layers):
    """torchvision's ResNet (BasicBlock), rebuilt from its definition."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, inplanes, planes, stride, downsample):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU()
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU()
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            inplanes = 64
            for i, (planes, n) in enumerate(zip((64, 128, 256, 512), layers)):
                stride = 1 if i == 0 else 2
                down = None
                if stride != 1 or inplanes != planes:
                    down = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))
                blocks = [Block(inplanes, planes, stride, down)] + [Block(planes, planes, 1, None) for _ in range(n - 1)]
                inplanes = planes
                setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512, 1000)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return Net()


@pytest.mark.parametrize("name", list(MODELS))
def test_model_forward_and_tape_gradients(name):
    spec = MODELS[name]
    case = spec.case(seed=0, dtype="float64", size="small")
    if name in ("resnet34", "resnet50"):  # 32x32, the smallest the five halvings allow, keeps this fast
        case = spec.case(seed=0, dtype="float64", input_shape=(3, 32, 32), batch=2)
    model, inputs = materialise(case)
    y = model(*inputs)
    assert np.all(np.isfinite(y))
    r = np.random.default_rng(3).standard_normal(np.shape(y))
    grads = gradcheck.gradient(lambda m, *xs: ops.sum(m(*xs) * r), model, *inputs)
    g_model = grads[0]
    leaves = g_model.named_parameters()
    assert [p for p, _ in leaves] == [p for p, _ in model.named_parameters()]
    assert all(np.all(np.isfinite(g)) for _, g in leaves)
    zero = [p for p, g in leaves if not np.any(g)]
    assert not zero, f"{name}: parameters with an all-zero gradient: {zero}"
    if spec.input_kind == "float":
        assert grads[1].shape == inputs[0].shape and np.any(grads[1])
    else:
        assert grads[1] is None  # token ids are constants


def test_model_spec_options_and_errors():
    spec = get_model("transformer")
    m = spec.build(0, vocab_size=20, block_size=5, d_model=8, n_head=2, n_layer=1)
    (ids,) = spec.inputs(1, batch=3, vocab_size=20, block_size=5)
    assert ids.shape == (3, 5) and ids.dtype == np.int64 and ids.max() < 20
    assert m(ids).shape == (3, 5, 20)
    with pytest.raises(ValueError, match="no option 'depth'"):
        spec.build(0, depth=3)
    with pytest.raises(KeyError, match="resnet18"):
        get_model("resnet17")
    with pytest.raises(ValueError, match="block_size=5"):
        m(np.zeros((1, 6), np.int64))
    case = get_model("resnet18").case(input_shape=(3, 64, 64), batch=2, num_classes=10)
    assert case.name == "resnet18[3x64x64,b2]"
    model, (x,) = materialise(case)
    assert x.shape == (2, 3, 64, 64) and x.dtype == np.float32 and np.shape(model.fc.weight) == (10, 512)


def test_model_builds_are_deterministic():
    a, b = MODELS["unet_small"].build(5), MODELS["unet_small"].build(5)
    for (p, u), (_, v) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(u, v, err_msg=p)
