"""MobileNetV3-Small (Howard et al., 2019) as torchvision builds it, written out here (torchvision
is not a dependency), with random weights, exported to ONNX with a dynamic batch: about 2.5 M
parameters and 60 M multiply-adds per 224x224 image, like the real one."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

# torchvision's mobilenet_v3_small: (in, kernel, expanded, out, squeeze-excite, hardswish, stride)
BLOCKS = (
    (16, 3, 16, 16, True, False, 2), (16, 3, 72, 24, False, False, 2),
    (24, 3, 88, 24, False, False, 1), (24, 5, 96, 40, True, True, 2),
    (40, 5, 240, 40, True, True, 1), (40, 5, 240, 40, True, True, 1),
    (40, 5, 120, 48, True, True, 1), (48, 5, 144, 48, True, True, 1),
    (48, 5, 288, 96, True, True, 2), (96, 5, 576, 96, True, True, 1),
    (96, 5, 576, 96, True, True, 1),
)


def _divisible(value: float, divisor: int = 8) -> int:
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _conv(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1,
          act: nn.Module | None = None) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act] if act is not None else []))


class _SqueezeExcite(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        squeeze = _divisible(channels // 4)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = nn.functional.adaptive_avg_pool2d(x, 1)
        scale = nn.functional.hardsigmoid(self.fc2(nn.functional.relu(self.fc1(scale))))
        return x * scale


class _Block(nn.Module):
    def __init__(self, cin: int, kernel: int, expanded: int, cout: int, se: bool, hs: bool,
                 stride: int) -> None:
        super().__init__()
        act: type[nn.Module] = nn.Hardswish if hs else nn.ReLU
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(_conv(cin, expanded, 1, act=act()))
        layers.append(_conv(expanded, expanded, kernel, stride, expanded, act=act()))
        if se:
            layers.append(_SqueezeExcite(expanded))
        layers.append(_conv(expanded, cout, 1))
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class MobileNetV3Small(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.features = nn.Sequential(_conv(3, 16, 3, 2, act=nn.Hardswish()),
                                      *(_Block(*block) for block in BLOCKS),
                                      _conv(96, 576, 1, act=nn.Hardswish()))
        self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(),
                                        nn.Linear(1024, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = nn.functional.adaptive_avg_pool2d(self.features(x), 1).flatten(1)
        return self.classifier(pooled)


def write_mobilenet(path: Path, seed: int = 0) -> Path:
    """pixel_values FP32 [N, 3, 224, 224] -> logits FP32 [N, 1000]."""
    torch.manual_seed(seed)
    model = MobileNetV3Small().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.zeros(1, 3, 224, 224),), str(path),
                          input_names=["pixel_values"], output_names=["logits"],
                          dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}},
                          opset_version=17, dynamo=False)
    return path
