"""The browser dashboard: runs, per-step charts, the rollout viewer with the forking tokens
outlined, and eval/entropy reports, read from run directories (`rldojo dashboard`).

`create_app(roots)` is the web app; `start_dashboard(roots)` serves it in a thread.
"""

from rldojo.dashboard.app import api_router, create_app
from rldojo.dashboard.server import DashboardHandle, start_dashboard

__all__ = ["DashboardHandle", "api_router", "create_app", "start_dashboard"]
