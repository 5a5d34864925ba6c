"""The job a node has worked for, kept in its data dir (``job.json``).

Restarted with no ``--learner``, no ``--job-id`` and no invite, a node keeps
to that job: it waits for that learner rather than join whatever job the DHT
lists meanwhile (a decoy, or a stranger's job, while its learner is down).
Naming a learner, a job or an invite moves it to another job on purpose; the
file then names the new one after its first accepted batch.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from protocol.process.logs import event

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkedFor:
    job_id: str
    learner: str  # its peer id


def recall(path: Path) -> WorkedFor | None:
    """The job ``path`` names; None if there is none (or the file is not ours: it is then ignored, and said so)."""
    try:
        data = json.loads(path.read_text())
        return WorkedFor(job_id=str(data["job_id"]), learner=str(data["learner"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        event(log, logging.WARNING, "ignoring an unreadable job memory", path=str(path), error=exc)
        return None


def remember(path: Path, job: WorkedFor) -> None:
    """Keep ``job`` in ``path``, whole or not at all (written aside, then renamed)."""
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(asdict(job)))
    os.replace(partial, path)
