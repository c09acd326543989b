"""The playbook registry: one instance of each playbook of `PLAYBOOK_SPECS`, by name; a name registers once."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Mapping

from jobdiagd.tsdb.playbooks import PLAYBOOK_SPECS, PlaybookSpec
from jobdiagd.tsdb.playbooks.base import Playbook


class PlaybookRegistry(Mapping[str, Playbook]):
    """Playbooks by name, in registration order. A second playbook of a name already registered
    is refused, as prometheus_client's `CollectorRegistry` refuses a duplicated timeseries: the
    first one would silently stop being run."""

    def __init__(self, playbooks: Iterable[Playbook] = ()) -> None:
        self._by_name: dict[str, Playbook] = {}
        for p in playbooks:
            self.register(p)

    def register(self, playbook: Playbook) -> None:
        if playbook.name in self._by_name:
            raise ValueError(f"Duplicated playbook in PlaybookRegistry: {playbook.name!r}")
        self._by_name[playbook.name] = playbook

    def __getitem__(self, name: str) -> Playbook:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)


def load(spec: PlaybookSpec) -> Playbook:
    """The spec's playbook, built; its `name` must be the spec's."""
    module = importlib.import_module(f".{spec.module}", __package__)
    playbook: Playbook = getattr(module, spec.cls)()
    if playbook.name != spec.name:
        raise ValueError(f"playbook {spec.module}.{spec.cls} is named {playbook.name!r}, not {spec.name!r}")
    return playbook


PLAYBOOKS = PlaybookRegistry(load(s) for s in PLAYBOOK_SPECS)
