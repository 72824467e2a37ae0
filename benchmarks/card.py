"""A smaller card on a large one: another process holds all of the device's free memory but G GiB, for as long as
a server runs beside it, so that the server meets a G GiB card's limits for real (comfy-aimdo pages weights, torch's
allocator and ComfyUI's own free-memory checks see G GiB), where --reserve-vram and a memory fraction only bound what
ComfyUI and torch ask for. nvidia-smi sees both processes: the server's share is a sample less the holder's.

    with Ballast(22.0) as held:      # held: the holder's bytes as nvidia-smi counts them (its context included)
        ...
"""
from __future__ import annotations

import subprocess
import sys
import time

from .canvas_pipeline import gib, gpu_used_bytes

HOLDER = r"""
import sys, torch
free, total = torch.cuda.mem_get_info(0)
keep = int(float(sys.argv[1]) * 2 ** 30)
hold = free - keep
if hold <= 0:
    print(f"refused: the device has {free} bytes free, not more than {keep}", flush=True)
    sys.exit(3)
block = torch.empty(hold, dtype=torch.uint8, device="cuda:0")
free_after, _ = torch.cuda.mem_get_info(0)
print(f"ready {hold} {free_after} {total}", flush=True)
sys.stdin.read()
"""


class Ballast:
    """Holds all of device 0's free memory but `card_gib` GiB in a child process while the block runs."""

    def __init__(self, card_gib: float, python: str = sys.executable):
        self.card_gib, self.python = card_gib, python
        self.process = None
        self.record: dict = {"card_gib": card_gib}

    def __enter__(self) -> dict:
        before = gpu_used_bytes()
        self.process = subprocess.Popen([self.python, "-c", HOLDER, str(self.card_gib)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline().split()
        if not line or line[0] != "ready":
            self.__exit__(None, None, None)
            raise RuntimeError(f"the memory holder did not start: {' '.join(line) or 'no answer'}")
        time.sleep(1.0)
        after = gpu_used_bytes()
        held = (after - before) if after is not None and before is not None else int(line[1])
        self.record.update({"held_gib": gib(held), "held_bytes": held, "tensor_bytes": int(line[1]),
                            "free_after_gib": gib(int(line[2])), "device_total_gib": gib(int(line[3])),
                            "used_before_gib": gib(before)})
        return self.record

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


def server_share(records: list[dict], held_gib: float) -> None:
    """Each node's device peak (nvidia-smi, the whole device) as the server's share: the sample less the holder's
    bytes; the sample stays as `peak_device_used_gib_with_holder`."""
    for record in records:
        for node in record.get("nodes", []):
            value = node.get("peak_gpu_used_gib")
            if value is not None and "peak_device_used_gib_with_holder" not in node:
                node["peak_device_used_gib_with_holder"] = value
                node["peak_gpu_used_gib"] = round(value - held_gib, 2)
