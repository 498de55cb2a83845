import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pyspark_abs.errors import ConfigError, InjectedFault
from pyspark_abs.faults import Fault, FaultAction, FaultInjector, FaultStep, task_fault


def test_driver_fault_fires_once_at_its_step_and_epoch() -> None:
    injector = FaultInjector([Fault(FaultStep.AFTER_PREPARED, epoch=2)])
    injector.at(FaultStep.AFTER_PREPARED, 1)
    injector.at(FaultStep.AFTER_ALIGN, 2)
    with pytest.raises(InjectedFault, match="'after_prepared' of epoch 2"):
        injector.at(FaultStep.AFTER_PREPARED, 2)
    injector.at(FaultStep.AFTER_PREPARED, 2)


def test_task_fault_matches_partition_and_attempt() -> None:
    faults = [Fault(FaultStep.PRECOMMIT_TASK, epoch=1, partition=0, action=FaultAction.DROP_MARKER)]
    assert task_fault(faults, 1, 0, 0) == faults[0]
    assert task_fault(faults, 1, 0, 1) is None
    assert task_fault(faults, 1, 1, 0) is None
    assert task_fault(faults, 2, 0, 0) is None
    every_attempt = [Fault(FaultStep.PRECOMMIT_TASK, attempt=None)]
    assert task_fault(every_attempt, 5, 3, 2) == every_attempt[0]


def test_damage_actions_only_apply_in_tasks() -> None:
    with pytest.raises(ConfigError, match="applies only to step 'precommit_task'"):
        Fault(FaultStep.AFTER_ALIGN, action=FaultAction.DELETE_FILE)


def test_steps_and_actions_parse_from_strings() -> None:
    fault = Fault("after_committed", 3, "exit")  # type: ignore[arg-type]
    assert fault.step is FaultStep.AFTER_COMMITTED
    assert fault.action is FaultAction.EXIT


def test_pause_only_applies_on_the_driver() -> None:
    with pytest.raises(ConfigError, match="applies only to driver steps, not 'precommit_task'"):
        Fault(FaultStep.PRECOMMIT_TASK, action=FaultAction.PAUSE)


def test_pause_stops_the_process_at_its_step_until_continued() -> None:
    code = (
        "from pyspark_abs.faults import Fault, FaultInjector, FaultStep\n"
        "injector = FaultInjector([Fault('after_prepared', 1, 'pause')])\n"
        "injector.at(FaultStep.AFTER_PREPARED, 0)\n"
        "print('before', flush=True)\n"
        "injector.at(FaultStep.AFTER_PREPARED, 1)\n"
        "print('resumed')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, text=True
    )
    _, status = os.waitpid(child.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status)
    assert os.WSTOPSIG(status) == signal.SIGSTOP
    os.kill(child.pid, signal.SIGCONT)
    out, _ = child.communicate(timeout=60)
    assert (child.returncode, out.split()) == (0, ["before", "resumed"])
