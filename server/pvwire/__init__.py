"""pvwire: EPICS process variables to web UIs and Python at control-room scale."""

__version__ = "0.1.0"
