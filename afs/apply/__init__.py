"""Applying a task's winner to the target database: plan (pure), resolve (which database, pure),
target (I/O), audit, run."""

from afs.apply.plan import ApplyPlan, plan_winner, render_plan
from afs.apply.run import apply_winner, load_plan, rollback_task

__all__ = ["ApplyPlan", "apply_winner", "load_plan", "plan_winner", "render_plan", "rollback_task"]
