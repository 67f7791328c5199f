"""Per-conversation git worktrees (the manager lands with the worktree issue)."""
