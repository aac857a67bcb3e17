"""`make gpu-check`: what only a CUDA GPU can show, as one JSON object on stdout.

- pipeline: the default pipeline end to end with ``device: cuda`` (a clone of this
  repo's HEAD in a temporary folder), and two CUDA runs of pretrain and finetune@swag
  bitwise equal;
- cpu_vs_device, bf16_vs_fp32: test metrics of a short SWAG run (mnist5k) on the CPU
  and the GPU, and in bf16 and fp32 on the GPU, within stated tolerances;
- throughput: images/s of SWAG fine-tuning (PreResNet-20, WideResNet-28x10; CIFAR-shaped
  uint8 batches of 128, crop + flip) for ours, a bare PyTorch loop with the same
  precision, layout and augmentation ops, and the SWAG reference code's own loop
  (``swag.utils.train_epoch`` over a DataLoader with torchvision transforms, fp32);
- evaluation: a 30-sample SWAG evaluation against S x (BN pass + forward) by hand;
- peak GPU memory of each measurement.

Without a CUDA device it says so in one line and exits 2. ``--device cpu --quick``
runs every measurement at toy sizes on the CPU (to develop and test the script).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check_parts as parts  # noqa: E402
from gpu_check_throughput import throughput  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--quick", action="store_true", help="toy sizes (a smoke run)")
    parser.add_argument("--skip-pipeline", action="store_true", help="no dvc repro runs")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "gpu-check: no CUDA device (torch.cuda.is_available() is False); "
            "run it on a machine with an NVIDIA GPU",
            file=sys.stderr,
        )
        return 2
    device = torch.device(args.device)
    size = parts.Size.quick() if args.quick else parts.Size.full()
    started = time.perf_counter()
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "quick": args.quick,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if not args.skip_pipeline:
        out["pipeline"] = parts.pipeline(device)
    out["cpu_vs_device"] = parts.cpu_vs_device(device, size)
    out["bf16_vs_fp32"] = parts.bf16_vs_fp32(device, size)
    out["throughput"] = {model: throughput(model, device, size) for model in size.throughput_models}
    out["evaluation"] = parts.evaluation(device, size)
    out["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
