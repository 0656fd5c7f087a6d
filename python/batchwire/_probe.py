"""Asking the coordinator something from a short-lived subprocess (``python -m
batchwire._probe``), so that the asking process never starts the library's network runtime:
batchwire.torch.BatchDataset's len() is asked in the DataLoader's main process, which may fork
its workers afterwards, and a child forked from a process that ran the runtime cannot use it
(loader.check_fork_safe). Internal to the package.

The subprocess reads one JSON request on stdin -- {"options": Loader's keyword arguments,
"epoch": E} -- and writes one JSON line: {"steps": N} or {"error": {"code", "rc",
"message"}}.
"""

import json
import os
import subprocess
import sys
from typing import Any, Dict, Mapping

from . import errors
from ._cdefs import BW_INTERNAL, BW_INVALID_ARGUMENT


def rank_steps(options: Mapping[str, Any], epoch: int) -> int:
    """batchwire.rank_steps(epoch, **options), run in a subprocess; raises what it raised.
    Interruptible: Ctrl-C in the caller ends the subprocess too."""
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    request = json.dumps({"options": options, "epoch": int(epoch)}, default=str)
    # stderr is the caller's: the library's WARNING lines (a coordinator being retried) show.
    r = subprocess.run([sys.executable, "-m", "batchwire._probe"], input=request.encode(),
                       stdout=subprocess.PIPE, env=env)
    lines = [ln for ln in r.stdout.decode("utf-8", "replace").splitlines() if ln.startswith("{")]
    try:
        answer = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise errors.InternalError(
            "len(): the subprocess asking the coordinator for this rank's steps (%s -m "
            "batchwire._probe) ended with status %d and no answer (its messages are on "
            "stderr above)" % (sys.executable, r.returncode))
    if "error" in answer:
        e = answer["error"]
        raise errors.from_rc(int(e.get("rc", BW_INTERNAL)), e.get("message", ""), code=e.get("code"))
    return int(answer["steps"])


def rank_samples(options: Mapping[str, Any], epoch: int) -> int:
    """Samples of this rank's batches in `epoch` counted as full batches: steps times the
    per-rank batch size (batch_size, or batch_size / world size with split_batches). Exact
    unless the epoch's last batch is short (drop_last=False on a dataset that does not
    divide); len(DataLoader(ds, batch_size=per-rank batch size)) is exact either way."""
    per_rank = int(options.get("batch_size", 1))
    if options.get("split_batches"):
        world = options.get("world_size")
        if world is None:
            world = int(os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or 1)
        per_rank //= max(1, int(world))
    return rank_steps(options, epoch) * per_rank


def main() -> None:
    from . import loader

    out: Dict[str, Any]
    try:
        request = json.loads(sys.stdin.read())
        steps = loader.rank_steps(request["epoch"], **request["options"])
        out = {"steps": steps}
    except errors.Error as e:
        out = {"error": {"code": e.code, "rc": e.rc, "message": e.message}}
    except (TypeError, ValueError, KeyError) as e:
        out = {"error": {"code": "BW_INVALID_ARGUMENT", "rc": BW_INVALID_ARGUMENT, "message": str(e)}}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
