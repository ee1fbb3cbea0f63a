"""The failure taxonomy on realistic reproduce.sh logs."""

from __future__ import annotations

import pytest

from scoring.failure import FailureClass, RunFacts, classify

PIP_MISSING = """\
+ pip install -r requirements.txt
Collecting torch==2.9.9
ERROR: Could not find a version that satisfies the requirement torch==2.9.9 (from versions: 2.2.0)
ERROR: No matching distribution found for torch==2.9.9
"""

MODULE_MISSING = """\
+ python3 train.py --epochs 10
Traceback (most recent call last):
  File "/home/submission/train.py", line 3, in <module>
    import wandb
ModuleNotFoundError: No module named 'wandb'
"""

CUDA_OOM = """\
epoch 1/50: loss 2.31
Traceback (most recent call last):
  File "/home/submission/train.py", line 88, in <module>
    loss.backward()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.11 GiB total)
"""

KILLED = """\
loading dataset into memory
reproduce.sh: line 4:    57 Killed                  python3 build_index.py
"""

NO_GPU = """\
Traceback (most recent call last):
  File "/home/submission/main.py", line 12, in <module>
    model = Net().cuda()
  File "/usr/lib/python3/dist-packages/torch/cuda/__init__.py", line 302, in _lazy_init
    raise RuntimeError("No CUDA GPUs are available")
RuntimeError: No CUDA GPUs are available
"""

NO_DRIVER = """\
AssertionError: Torch not compiled with CUDA enabled
"""

SCRIPT_ERROR = """\
train 1347 images, test 450 images
Traceback (most recent call last):
  File "/home/submission/reproduce.py", line 40, in <module>
    main()
  File "/home/submission/reproduce.py", line 31, in main
    accuracy = correct / total
ZeroDivisionError: division by zero
"""

SHELL_ERROR = """\
reproduce.sh: line 7: cd: results/run-1: No such file or directory
"""

COMMAND_MISSING = "reproduce.sh: line 2: conda: command not found\n"


def facts(log: str, exit_code: int | None = 1, **kw: object) -> RunFacts:
    values: dict[str, object] = {
        "reproduce_sh_present": True,
        "exit_code": exit_code,
        "timed_out": False,
        "log": log,
    }
    values.update(kw)
    return RunFacts(**values)  # type: ignore[arg-type]


def test_success_has_no_class() -> None:
    assert classify(facts("all good\n", exit_code=0)) is None


@pytest.mark.parametrize(
    ("log", "exit_code", "expected", "evidence"),
    [
        (PIP_MISSING, 1, FailureClass.ENVIRONMENT, "No matching distribution"),
        (MODULE_MISSING, 1, FailureClass.ENVIRONMENT, "No module named 'wandb'"),
        (CUDA_OOM, 1, FailureClass.OUT_OF_MEMORY, "CUDA out of memory"),
        (KILLED, 137, FailureClass.OUT_OF_MEMORY, "Killed"),
        ("epoch 3\n", 137, FailureClass.OUT_OF_MEMORY, "exit code 137"),
        (NO_GPU, 1, FailureClass.GPU_UNAVAILABLE, "No CUDA GPUs are available"),
        (NO_DRIVER, 1, FailureClass.GPU_UNAVAILABLE, "Torch not compiled with CUDA"),
        (SCRIPT_ERROR, 1, FailureClass.SCRIPT_ERROR, "ZeroDivisionError: division by zero"),
        (
            "Traceback (most recent call last):\njson.decoder.JSONDecodeError: Expecting value\n",
            1,
            FailureClass.SCRIPT_ERROR,
            "json.decoder.JSONDecodeError",
        ),
        (SHELL_ERROR, 1, FailureClass.SCRIPT_ERROR, "exit code 1"),
        (COMMAND_MISSING, 127, FailureClass.ENVIRONMENT, "conda: command not found"),
        ("", 127, FailureClass.ENVIRONMENT, "exit code 127"),
    ],
)
def test_classes_from_logs(log: str, exit_code: int, expected: FailureClass, evidence: str) -> None:
    result = classify(facts(log, exit_code))
    assert result is not None
    assert result.failure is expected
    assert evidence in result.evidence


def test_missing_script_wins_over_everything() -> None:
    result = classify(facts(CUDA_OOM, 127, reproduce_sh_present=False))
    assert result is not None and result.failure is FailureClass.MISSING_REPRODUCE_SH


def test_timeout_wins_over_log_rules() -> None:
    result = classify(facts(MODULE_MISSING, None, timed_out=True))
    assert result is not None and result.failure is FailureClass.TIMEOUT


def test_exit_zero_with_timeout_is_a_timeout() -> None:
    result = classify(facts("", 0, timed_out=True))
    assert result is not None and result.failure is FailureClass.TIMEOUT


def test_a_run_that_reached_the_process_limit_failed_even_with_exit_zero() -> None:
    result = classify(facts("bash: fork: retry: Resource temporarily unavailable\n", 0,
                            process_limit_reached=True))  # fmt: skip
    assert result is not None and result.failure is FailureClass.SCRIPT_ERROR
    assert result.rule == "process-limit"


def test_memory_beats_the_traceback_it_caused() -> None:
    """An OOM shows up inside a traceback; the cause is memory, not the script."""
    result = classify(facts(CUDA_OOM, 1))
    assert result is not None and result.failure is FailureClass.OUT_OF_MEMORY


def test_only_the_tail_is_read() -> None:
    """An import error early in a huge log followed by a later crash is not what decided it."""
    log = MODULE_MISSING + "x" * 200_000 + "\n" + SCRIPT_ERROR
    result = classify(facts(log, 1))
    assert result is not None and result.failure is FailureClass.SCRIPT_ERROR


def test_every_class_has_a_label() -> None:
    assert all(c.label for c in FailureClass)
