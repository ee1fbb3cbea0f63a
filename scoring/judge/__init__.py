"""The LLM judge: file selection, ranking, per-leaf grading, grade cache (see engine)."""

from scoring.judge.cache import CachedGrade, GradeCache, MemoryGradeCache
from scoring.judge.engine import Judge, JudgeRun, LeafResult
from scoring.judge.prompts import TaskMaterials
from scoring.judge.submission import LogFile, ReproductionRecord, SubmissionView

__all__ = [
    "CachedGrade",
    "GradeCache",
    "Judge",
    "JudgeRun",
    "LeafResult",
    "LogFile",
    "MemoryGradeCache",
    "ReproductionRecord",
    "SubmissionView",
    "TaskMaterials",
]
