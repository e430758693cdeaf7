"""The server's own health as EPICS PVs under `--status-prefix` (as pvagw's `statusprefix` and
the CA gateway's `-prefix` publish theirs): the figures `/metrics` reads, as PVA NTScalars with
units and alarm limits, for the facility's archiver, alarm handler and screens."""

from .figures import Window, quantile
from .pvs import Alarm, StatusPv, status_pvs
from .server import StatusServer, claim_slot

__all__ = ["Alarm", "StatusPv", "StatusServer", "Window", "claim_slot", "quantile", "status_pvs"]
