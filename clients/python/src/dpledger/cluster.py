"""Cluster routing: each dataset's requests go to the node that owns it.

In a cluster (``dpledger serve --cluster``; the server's ``docs/cluster.md``) any
node accepts any request and forwards it to the dataset's owner; going to the owner
directly saves that hop. The client keeps a map from dataset id to the owner's
advertised URL, read from ``GET /v1/cluster`` the first time a dataset's request is
sent, and refreshed when a node answers ``503`` with the problem type
:data:`NOT_OWNER` (the node could neither serve nor forward the request: the lease
is moving, or the owner is unreachable). Such an answer promises that nothing was
applied, so the request is sent again whatever its retry class, to the owner the
problem names when it names one. A connection refused by an owner sends the request
back to the configured base URL and refreshes the map.

Against a single-node server the map stays empty (``"mode": "single"``) and every
request goes to the base URL, as before.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Optional
from urllib.parse import unquote

__all__ = ["NOT_OWNER", "Routes", "dataset_of", "retry_after_seconds"]

#: The problem type of a node that cannot serve or forward a dataset's request.
NOT_OWNER = "urn:dpledger:problem:not-owner"


class Routes:
    """Dataset id -> owner base URL; thread-safe, shared by one client."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded = False
        self._owners: Dict[str, str] = {}
        #: From the last map read: True for a cluster, False for a single node,
        #: None when it could not be read.
        self._cluster: Optional[bool] = None
        self._listed: set = set()
        self._sharded: set = set()

    def needs_load(self) -> bool:
        """Whether ``GET /v1/cluster`` should be read before a dataset's request
        (at most once until the map is invalidated)."""
        with self._lock:
            return not self._loaded

    def owner(self, dataset: str) -> Optional[str]:
        with self._lock:
            return self._owners.get(dataset)

    def install(self, view: Optional[Dict[str, Any]]) -> None:
        """Replace the map with a ``GET /v1/cluster`` answer (``None``: the server
        has no cluster endpoint or refused it; requests go to the base URL)."""
        owners: Dict[str, str] = {}
        listed = set()
        for entry in (view or {}).get("datasets", []) or []:
            listed.add(str(entry.get("dataset")))
            url = entry.get("advertise")
            if isinstance(url, str) and url.startswith(("http://", "https://")):
                owners[str(entry.get("dataset"))] = url.rstrip("/")
        with self._lock:
            self._loaded = True
            self._owners = owners
            self._listed = listed
            self._cluster = None if view is None else view.get("mode") == "cluster"
            # A sharded dataset's leases are its shards' (`{d}~{start}`).
            self._sharded = {name.split("~", 1)[0] for name in listed if "~" in name}

    def may_be_sharded(self, dataset: str) -> Optional[bool]:
        """What the last map read says of ``dataset``: ``True`` when it lists
        its shards (``{dataset}~{start}``: a sharded dataset's leases are its
        shards'), ``False`` when it lists the dataset itself or the server is a
        single node, ``None`` when it does not say (no map, or a dataset the
        map does not list)."""
        with self._lock:
            if dataset in self._sharded:
                return True
            if dataset in self._listed or self._cluster is False:
                return False
            return None

    def learn(self, dataset: str, advertise: str) -> None:
        if advertise.startswith(("http://", "https://")):
            with self._lock:
                self._owners[dataset] = advertise.rstrip("/")

    def forget(self, dataset: str) -> None:
        """The owner is not known any more: base URL, and read the map again."""
        with self._lock:
            self._owners.pop(dataset, None)
            self._loaded = False


def dataset_of(path: str) -> Optional[str]:
    """The dataset a request path (``/v1/datasets/{d}/...``) addresses, if any."""
    parts = path.split("/")
    if len(parts) >= 4 and parts[0] == "" and parts[1] == "v1" and parts[2] == "datasets":
        return unquote(parts[3]) or None
    return None


def retry_after_seconds(value: Optional[str]) -> Optional[float]:
    """The seconds of a ``Retry-After`` header (delta-seconds form), capped at 30."""
    if value is None:
        return None
    try:
        return float(min(30, max(0, int(value.strip()))))
    except ValueError:
        return None
