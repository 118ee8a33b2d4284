"""``probe()``: what the library sees of this machine's devices and pairs, as dicts."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from . import _native


class ProbeReport:
    """The probe's report: ``devices``, ``pairs`` (CUDA's and NVML's facts per ordered pair),
    ``verdicts`` (per ordered pair: is P2P on, and if not the exact reason, the remedy and
    what the driver patch would do) and ``host``, all plain dicts, and ``links``, the
    measured link rates (``probe(measure=True)``; else None); ``print(report)`` shows the
    tables ``gp2p probe`` prints (with ``--measure``'s), ``to_json()`` the JSON
    ``gp2p probe --json FILE`` saves."""

    def __init__(self, data: Dict[str, Any], text: str, links: Optional[Dict[str, Any]] = None,
                 links_text: str = "") -> None:
        self._data = data
        self._text = text
        self._links = links
        self._links_text = links_text

    @property
    def links(self) -> Optional[Dict[str, Any]]:
        """Measured rates, GB/s = 1e9 B/s, medians of ``runs`` timed transfers of
        ``transfer_bytes``: ``devices`` (per device ``h2d_gbps``, ``d2h_gbps`` and
        ``duplex_gbps``, each way with both directions at once), ``together`` (every card
        busy both ways at the same time: per card ``d2h_gbps`` and ``h2d_gbps``, their sum
        ``host_gbps`` through host memory, and what ``binds``: each card's own link, or the
        host), ``pairs`` (per ordered pair and route asked for, the route ``took`` and
        ``gbps``) and ``unopened`` devices; None unless the probe was asked to measure."""
        return self._links

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
        return self._text + self._links_text

    def __repr__(self) -> str:
        codes = " ".join("%d->%d:%s" % (v["a"], v["b"], v["code"]) for v in self.verdicts)
        return "<ProbeReport %d device(s)%s>" % (len(self.devices), (" " + codes) if codes else "")


def probe(measure: bool = False) -> ProbeReport:
    """Probe this machine: devices, pairs and a verdict per ordered pair; with ``measure``
    also each device's link rates and each pair's copy rate (``report.links``; a few seconds
    per device and pair, on otherwise idle GPUs for figures that mean something). Raises
    ``UnavailableError`` without an NVIDIA driver."""
    if not isinstance(measure, bool):
        raise TypeError("measure: expected True or False, got %r" % (measure,))
    data, text, links = _native.probe(measure)
    if links is None:
        return ProbeReport(json.loads(data), text)
    return ProbeReport(json.loads(data), text, json.loads(links[0]), links[1])
