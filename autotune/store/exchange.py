"""The JSON document `export` writes and `import` reads, and the checks every imported entry
passes before anything is written: an import is untrusted input.

Each entry must describe a kernel that can run and a measurement that can be true: a config of
an installed family valid for the problem and for the named GPU (its static constraints always
apply, a GPU this release does not know being judged by the newest known one older than it), a
compute capability from 70 to 130, sizes and counts below 2^31 (the columns are 32-bit on every
database), strings no longer than their columns, medians from 0.5 us to an hour, and FLOP/s no
more than twice the GPU's tensor-core peak. Everything wrong with a document is reported at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._shown import shown
from ..measure.environment import Environment
from ..model.config import Config, InvalidConfig
from ..model.problem import MAX_SIZE, Problem
from ..model.space import class_mismatch, load_space, validate_config
from ..model.status import Status
from ..model.target import MAX_CC, MIN_CC, target_for_capability, tensor_peak_flops
from .models import BestConfig, Device
from .records import DeviceInfo, TrialResult

EXPORT_FORMAT = "cute-autotune-results"
EXPORT_VERSION = 1

MIN_MEDIAN_US = 0.5  # below any kernel launch
MAX_MEDIAN_US = 3600e6  # an hour
MAX_LISTED = 20  # refused entries named in one message


class BrokenRow(ValueError):
    """A database row (or an imported entry) that does not describe a runnable kernel."""


@dataclass(frozen=True)
class ImportEntry:
    device: DeviceInfo
    problem: Problem
    result: TrialResult  # the config and its median
    sdpa_default_us: float | None
    sdpa_flash_us: float | None
    trials: int
    study: str
    decision: str | None = None
    runner_up_us: float | None = None

    @property
    def key(self) -> tuple[str, int, int, Problem]:
        """What a best config is stored per: GPU model and problem."""
        return (
            self.device.name,
            self.device.compute_capability,
            self.device.sm_count,
            self.problem,
        )

    def same_result(self, other: ImportEntry) -> bool:
        return (self.result.config, self.result.median_us) == (
            other.result.config,
            other.result.median_us,
        )


def _length(column: Any) -> int:
    return int(column.type.length)


def _text(data: dict[str, Any], name: str, limit: int, *, default: str | None = None) -> str:
    value = data.get(name, default)
    if not isinstance(value, str) or len(value) > limit:
        got = f"{len(value)} characters" if isinstance(value, str) else shown(value)
        raise BrokenRow(f"{name} must be a string of at most {limit} characters, got {got}")
    if not value.isprintable():  # it is printed: `list`, `best`, `report`
        raise BrokenRow(
            f"{name} must be printable text (no control characters, newlines or "
            f"invisible format characters), got {shown(value)}"
        )
    return value


def _integer(
    data: dict[str, Any], name: str, low: int, high: int, *, default: int | None = None
) -> int:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BrokenRow(f"{name} must be an integer from {low} to {high}, got {shown(value)}")
    return value


def _median(
    data: dict[str, Any],
    name: str,
    problem: Problem,
    device: DeviceInfo,
    *,
    optional: bool = False,
) -> float | None:
    value = data.get(name)
    if value is None and optional:
        return None
    # compared as they are: an integer no float holds (10^400) is out of range, not an
    # OverflowError, and NaN fails every comparison
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (MIN_MEDIAN_US <= value <= MAX_MEDIAN_US)
    ):
        raise BrokenRow(
            f"{name} must be a time from {MIN_MEDIAN_US} us to an hour, got {shown(value)}"
        )
    flops = problem.tflops(value) * 1e12
    peak = tensor_peak_flops(device.compute_capability, device.sm_count)
    if flops > 2 * peak:
        raise BrokenRow(
            f"{name} = {value} us would be {flops / 1e12:,.0f} TFLOP/s, more than "
            f"twice the tensor-core peak of {device.name} ({peak / 1e12:,.0f})"
        )
    return float(value)


def parse_device(data: Any) -> DeviceInfo:
    """The device `data` describes (an imported entry's, or a stored row's); BrokenRow if it
    cannot be one."""
    if not isinstance(data, dict):
        raise BrokenRow(f"'device' must be an object, got {shown(data)}")
    name = _text(data, "name", _length(Device.name))
    if not name:
        raise BrokenRow("the device has no name")
    return DeviceInfo(
        name,
        _integer(data, "compute_capability", MIN_CC, MAX_CC),
        _integer(data, "sm_count", 1, MAX_SIZE),
        _text(data, "driver_version", _length(Device.driver_version)),
        _text(data, "cuda_version", _length(Device.cuda_version)),
    )


def _violations_on(config: Config, device: DeviceInfo) -> list[str]:
    """Why `config` cannot run on `device`, by its family's space."""
    space = load_space(config.family)
    if not space.supports(device.compute_capability):
        return [f"family {config.family} runs on {space.cc_range()}"]
    return space.violations(config, target_for_capability(device.compute_capability))


def _entry(entry: Any, checked: dict[tuple[Config, int], list[str]]) -> ImportEntry:
    if not isinstance(entry, dict):
        raise BrokenRow("entry is not an object")
    device = parse_device(entry.get("device"))
    if not isinstance(entry.get("problem"), dict):
        raise BrokenRow(f"'problem' must be an object, got {shown(entry.get('problem'))}")
    problem = Problem(**entry["problem"])
    config = validate_config(Config.from_dict(entry.get("config")))
    if entry.get("family", config.family) != config.family:
        raise BrokenRow(f"family {shown(entry['family'])} but a {config.family} config")
    mismatch = class_mismatch(problem, config)
    if mismatch:
        raise BrokenRow(f"config is for another problem class ({mismatch} differ)")
    reasons = checked.get((config, device.compute_capability))
    if reasons is None:  # many entries share a config: its constraints are evaluated once
        reasons = checked[(config, device.compute_capability)] = _violations_on(config, device)
    if reasons:
        raise BrokenRow(
            f"{config.family} config cannot run on {device.name} "
            f"(sm_{device.compute_capability}): {'; '.join(reasons)}"
        )
    median = _median(entry, "median_us", problem, device)
    env = Environment(
        regime=_optional_text(entry, "regime", _length(BestConfig.regime)),
        torch_version=_optional_text(entry, "torch_version", _length(BestConfig.torch_version)),
        cudnn_version=_optional_text(entry, "cudnn_version", _length(BestConfig.cudnn_version)),
    )
    result = TrialResult(
        config,
        Status.OK,
        median_us=median,
        p20_us=_median(entry, "p20_us", problem, device, optional=True),
        p80_us=_median(entry, "p80_us", problem, device, optional=True),
        env=env if any(env.as_dict().values()) else None,
    )
    return ImportEntry(
        device,
        problem,
        result,
        _median(entry, "sdpa_default_us", problem, device, optional=True),
        _median(entry, "sdpa_flash_us", problem, device, optional=True),
        _integer(entry, "trials", 0, MAX_SIZE, default=0),
        _text(entry, "study", _length(BestConfig.study), default="imported"),
        _optional_text(entry, "decision", 2000) or None,
        _median(entry, "runner_up_us", problem, device, optional=True),
    )


def _optional_text(data: dict[str, Any], name: str, limit: int) -> str:
    """A text field that may be absent or null (""), else bounded like `_text`."""
    if data.get(name) is None:
        return ""
    return _text(data, name, limit)


def parse_export(data: Any) -> list[ImportEntry]:
    """Validate an exported document; raise BrokenRow naming every bad entry (the first
    MAX_LISTED of them) and every conflicting duplicate."""
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise BrokenRow(f"not a {EXPORT_FORMAT} document")
    if data.get("version") != EXPORT_VERSION:
        raise BrokenRow(f"export version {shown(data.get('version'))} is not {EXPORT_VERSION}")
    results = data.get("results")
    if not isinstance(results, list):
        raise BrokenRow("'results' must be a list")
    parsed: list[ImportEntry] = []
    errors: list[str] = []
    first: dict[tuple[str, int, int, Problem], tuple[int, ImportEntry]] = {}
    checked: dict[tuple[Config, int], list[str]] = {}
    for i, raw in enumerate(results):
        try:
            entry = _entry(raw, checked)
        except (BrokenRow, InvalidConfig, KeyError, TypeError, ValueError) as exc:
            errors.append(f"entry #{i}: {exc}")
            continue
        earlier = first.setdefault(entry.key, (i, entry))
        if earlier[0] != i and not entry.same_result(earlier[1]):
            errors.append(
                f"entry #{i} repeats the GPU and problem of entry #{earlier[0]} "
                "with another result"
            )
        parsed.append(entry)
    if errors:
        more = len(errors) - MAX_LISTED
        listed = errors[:MAX_LISTED] + ([f"... and {more} more"] if more > 0 else [])
        raise BrokenRow("refused, nothing imported:\n  " + "\n  ".join(listed))
    return parsed
