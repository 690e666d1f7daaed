"""FakeJtop: a fake of jetson-stats' Python client (``from jtop import jtop``), 4.x.

Mirrors the parts of the API documented in shared/reference/jetson-apis.md §4 (read from
rbonghi/jetson_stats 4.3.1): ``with jtop() as j``, ``j.ok()``, ``j.nvpmodel`` (``.id``,
``.name``, ``.models``; set with an int id or a str name, applied asynchronously),
``j.jetson_clocks`` (acts as a bool; set with a bool only, else ValueError), ``j.fan``
(``.profile``, ``.speed``). It talks to a FakeJtopService instead of jtop.service.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class FakeJtopException(Exception):
    pass


@dataclass
class FakeJtopService:
    models: list[str] = field(default_factory=lambda: ["15W", "7W"])
    nvpmodel_id: int = 0
    jetson_clocks: bool = True
    fan_profile: str = "quiet"
    fan_speed: int = 30
    switch_polls: int = 3  # ok() calls before a requested mode takes effect
    running: bool = True
    calls: list[str] = field(default_factory=list)
    _pending: int | None = None
    _polls: int = 0


class FakeNVPModel:
    def __init__(self, svc: FakeJtopService) -> None:
        self._svc = svc

    @property
    def id(self) -> int:
        return self._svc.nvpmodel_id

    @property
    def name(self) -> str:
        return self._svc.models[self._svc.nvpmodel_id]

    @property
    def models(self) -> list[str]:
        return list(self._svc.models)


class FakeJetsonClocks:
    def __init__(self, svc: FakeJtopService) -> None:
        self._svc = svc

    def __bool__(self) -> bool:
        return self._svc.jetson_clocks


class FakeFan:
    def __init__(self, svc: FakeJtopService) -> None:
        self._svc = svc

    @property
    def profile(self) -> str:
        return self._svc.fan_profile

    @profile.setter
    def profile(self, value: str) -> None:
        self._svc.calls.append(f"fan.profile={value}")
        self._svc.fan_profile = value

    @property
    def speed(self) -> int:
        return self._svc.fan_speed

    @speed.setter
    def speed(self, value: int) -> None:
        self._svc.calls.append(f"fan.speed={value}")
        self._svc.fan_speed = value


class FakeJtop:
    def __init__(self, svc: FakeJtopService) -> None:
        self._svc = svc

    def __enter__(self) -> FakeJtop:
        if not self._svc.running:
            raise FakeJtopException(
                "The jtop.service is not active. Please run:\nsudo systemctl restart jtop.service"
            )
        return self

    def __exit__(self, *exc) -> None:
        return None

    def ok(self) -> bool:
        svc = self._svc
        if svc._pending is not None:
            svc._polls += 1
            if svc._polls >= svc.switch_polls:
                svc.nvpmodel_id, svc._pending = svc._pending, None
        return True

    @property
    def nvpmodel(self) -> FakeNVPModel:
        return FakeNVPModel(self._svc)

    @nvpmodel.setter
    def nvpmodel(self, value: int | str) -> None:
        svc = self._svc
        if isinstance(value, str):
            value = svc.models.index(value)
        if not isinstance(value, int) or not 0 <= value < len(svc.models):
            raise FakeJtopException(f"unknown nvpmodel {value!r}")
        svc.calls.append(f"nvpmodel={value}")
        svc._pending, svc._polls = value, 0

    @property
    def jetson_clocks(self) -> FakeJetsonClocks:
        return FakeJetsonClocks(self._svc)

    @jetson_clocks.setter
    def jetson_clocks(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise ValueError("Use a boolean")
        self._svc.calls.append(f"jetson_clocks={value}")
        self._svc.jetson_clocks = value

    @property
    def fan(self) -> FakeFan:
        return FakeFan(self._svc)


def fake_jtop_class(svc: FakeJtopService):
    """What ``from jtop import jtop`` gives: a class to call with no arguments."""
    return lambda: FakeJtop(svc)
