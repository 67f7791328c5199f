"""The git port: worktree operations behind one interface (see docs/git-port.md).

``RealGit`` runs the ``git`` binary; ``FakeGit`` models git on the active
(possibly pyfakefs) filesystem for the simulator. Both pass one contract suite.
"""

from herdsman.runtime.git.fake import FakeGit, Operation
from herdsman.runtime.git.port import (
    MISSING,
    Git,
    GitError,
    NotARepository,
    WorktreeDirty,
    WorktreeEntry,
    WorktreeExists,
    WorktreeHead,
    WorktreeState,
)
from herdsman.runtime.git.real import RealGit

__all__ = [
    "MISSING",
    "FakeGit",
    "Git",
    "GitError",
    "NotARepository",
    "Operation",
    "RealGit",
    "WorktreeDirty",
    "WorktreeEntry",
    "WorktreeExists",
    "WorktreeHead",
    "WorktreeState",
]
