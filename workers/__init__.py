"""gradefleet workers: the pure math verifier and the Celery fleet that runs it."""

from __future__ import annotations

__version__ = "0.1.0"
