"""``probe()``: what the library sees of this machine's devices and pairs, as dicts."""

from __future__ import annotations

import json
from typing import Any, Dict, List

from . import _native


class ProbeReport:
    """The probe's report: ``devices``, ``pairs`` (CUDA's and NVML's facts per ordered pair),
    ``verdicts`` (per ordered pair: is P2P on, and if not the exact reason, the remedy and
    what the driver patch would do) and ``host``, all plain dicts; ``print(report)`` shows
    the table ``gp2p probe`` prints, ``to_json()`` the JSON ``gp2p probe --json`` saves."""

    def __init__(self, data: Dict[str, Any], text: str) -> None:
        self._data = data
        self._text = text

    @property
    def host(self) -> Dict[str, Any]:
        return self._data["facts"]["host"]

    @property
    def devices(self) -> List[Dict[str, Any]]:
        return self._data["facts"]["devices"]

    @property
    def pairs(self) -> List[Dict[str, Any]]:
        return self._data["facts"]["pairs"]

    @property
    def verdicts(self) -> List[Dict[str, Any]]:
        return self._data["verdicts"]

    @property
    def missing_sources(self) -> List[str]:
        return self._data["facts"].get("missing_sources", [])

    def to_dict(self) -> Dict[str, Any]:
        return self._data

    def to_json(self) -> str:
        return json.dumps(self._data, indent=2)

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        codes = " ".join("%d->%d:%s" % (v["a"], v["b"], v["code"]) for v in self.verdicts)
        return "<ProbeReport %d device(s)%s>" % (len(self.devices), (" " + codes) if codes else "")


def probe() -> ProbeReport:
    """Probe this machine: devices, pairs and a verdict per ordered pair. Raises
    ``UnavailableError`` without an NVIDIA driver."""
    data, text = _native.probe()
    return ProbeReport(json.loads(data), text)
