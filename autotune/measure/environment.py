"""What a timing ran under: the software whose speed it measured (driver, CUDA, torch, cuDNN:
torch SDPA's speed is torch's and cuDNN's), and the SM clock and power the GPU held while it
ran. Stored with every timing, so that a result can be compared with one taken later
(`cute-autotune recheck`) and a speed-up is never read without what it was measured against.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Environment:
    regime: str = ""
    driver_version: str = ""
    cuda_version: str = ""
    torch_version: str = ""
    cudnn_version: str = ""
    sm_clock_mhz: float | None = None
    power_w: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Environment | None:
        if not isinstance(data, dict):
            return None
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    def software(self) -> tuple[str, str, str, str]:
        """The versions a timing depends on besides our own build."""
        return (self.driver_version, self.cuda_version, self.torch_version, self.cudnn_version)

    def with_clock(self, clock: tuple[float | None, float | None]) -> Environment:
        return replace(self, sm_clock_mhz=clock[0], power_w=clock[1])


def driver_version() -> str:
    """The NVIDIA driver's version (NVML's text when available, else the CUDA driver API's)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - NVML is optional
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
            if out.stdout.strip():
                return out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    import torch

    version = int(torch._C._cuda_getDriverVersion())  # type: ignore[attr-defined]
    return f"cuda-driver-{version // 1000}.{(version % 1000) // 10}"


def software(regime: str) -> Environment:
    """This process's versions (no clock reading)."""
    import torch

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return Environment(
        regime=regime,
        driver_version=driver_version(),
        cuda_version=str(torch.version.cuda),
        torch_version=torch.__version__,
        cudnn_version=str(cudnn) if cudnn else "",
    )


class ClockSampler:
    """Samples the SM clock (MHz) and board power (W) of one GPU every ~20 ms while open
    (`with ClockSampler(0) as s: ...; s.result()`), through nvidia-smi; (None, None) where it
    cannot (no nvidia-smi). Never changes clocks: the GPU runs as it would for a user."""

    def __init__(self, device_index: int, period_ms: int = 20) -> None:
        self._device = device_index
        self._period = period_ms
        self._clocks: list[float] = []
        self._power: list[float] = []
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ClockSampler:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return self
        try:
            self._proc = subprocess.Popen(
                [
                    smi,
                    "-i",
                    str(self._device),
                    "--query-gpu=clocks.sm,power.draw",
                    "--format=csv,noheader,nounits",
                    f"-lms={self._period}",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        except OSError:
            return self
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                clock, power = float(parts[0]), float(parts[1])
            except (IndexError, ValueError):
                continue
            self._clocks.append(clock)
            self._power.append(power)

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def result(self) -> tuple[float | None, float | None]:
        """Median SM clock and power over the samples (None where there were none)."""
        return (
            statistics.median(self._clocks) if self._clocks else None,
            statistics.median(self._power) if self._power else None,
        )


def gpu_available() -> bool:
    """Whether torch is installed and sees a CUDA GPU."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
