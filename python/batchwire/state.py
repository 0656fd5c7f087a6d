"""Checkpoints: one rank's state dict and the job-level checkpoint of every rank.

A rank's state (``Loader.state_dict()``, torchdata ``StatefulDataLoader`` style) is a plain
dict of str and int, so ``torch.save``/``torch.load`` (also ``weights_only=True``) and
Accelerate's ``register_for_checkpointing`` store it as it is::

    {"batchwire": 1, "job": "run1", "rank": 0, "world_size": 4, "epoch": 2, "step": 17,
     "cursor": "bwc1:..."}

``step`` is the next batch's step in ``epoch``; ``cursor`` is the library's cursor after the
last batch handed out (``Loader.cursor()``), which carries the job's fingerprint and, for
streams, where each source resumes. A state without ``cursor`` (from ``batchwire.torch``'s
DataLoader, whose main process has no loader) is a position: it resumes at (epoch, step).

The job-level checkpoint is every rank's cursor at one step, for launchers and elastic
resume (``Loader(elastic=True, resume=...)``, ``batchwire fetch --resume-elastic``)::

    {"batchwire_job": 1, "job": "run1", "world_size": 4, "cursors": ["bwc1:...", ...]}

``batchwire.job_checkpoint()`` reads it from the coordinator (every rank's committed
cursor); ``job_checkpoint_from(states)`` assembles it from the ranks' state dicts (e.g.
gathered with ``torch.distributed.all_gather_object``).
"""

import base64
import binascii
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from . import _lib
from . import errors

STATE_VERSION = 1
CURSOR_PREFIX = "bwc1:"

Cursor = Union[str, bytes, bytearray, memoryview]


def cursor_binary(cursor: Cursor) -> bytes:
    """The binary form of a cursor given as text ("bwc1:...") or bytes."""
    if isinstance(cursor, str):
        text = cursor.strip()
        if not text.startswith(CURSOR_PREFIX):
            raise errors.CorruptError("cursor refused: text cursors start with %r" %
                                      CURSOR_PREFIX)
        try:
            return base64.b64decode(text[len(CURSOR_PREFIX):], validate=True)
        except (binascii.Error, ValueError) as e:
            raise errors.CorruptError("cursor refused: its base64 is damaged (%s)" % e)
    if isinstance(cursor, (bytes, bytearray, memoryview)):
        return bytes(cursor)
    raise errors.InvalidArgumentError("a cursor is text ('bwc1:...') or bytes, not %s" %
                                      type(cursor).__name__)


def cursor_info(cursor: Cursor) -> Dict[str, Any]:
    """What a cursor says: job, fingerprint, rank, world_size, epoch, step. Decoded and
    checked by the library (bw_cursor_describe, include/batchwire/loader.h): CorruptError for
    anything that is not an intact cursor."""
    return _lib.cursor_info(cursor_binary(cursor))


def cursor_text(cursor: Cursor) -> str:
    """The text form of a cursor."""
    if isinstance(cursor, str):
        return cursor.strip()
    return CURSOR_PREFIX + base64.b64encode(bytes(cursor)).decode()


def rank_state(job: str, rank: int, world_size: int, epoch: int, step: int,
               cursor: Optional[str] = None) -> Dict[str, Any]:
    sd = {"batchwire": STATE_VERSION, "job": job, "rank": int(rank),
          "world_size": int(world_size), "epoch": int(epoch), "step": int(step)}
    if cursor is not None:
        sd["cursor"] = cursor
    return sd


def check_state(sd: Any, what: str = "state_dict") -> Dict[str, Any]:
    """A rank's state dict, checked: its keys and types (InvalidArgumentError otherwise)."""
    if not isinstance(sd, dict) or sd.get("batchwire") != STATE_VERSION:
        raise errors.InvalidArgumentError(
            "%s: expected a batchwire rank state (a dict with \"batchwire\": %d, from "
            "state_dict()), got %s" % (what, STATE_VERSION,
                                       type(sd).__name__ if not isinstance(sd, dict) else
                                       "a dict without it"))
    for key in ("job", "rank", "world_size", "epoch", "step"):
        if key not in sd:
            raise errors.InvalidArgumentError("%s: the state lacks %r" % (what, key))
    for key in ("rank", "world_size", "epoch", "step"):
        if isinstance(sd[key], bool) or not isinstance(sd[key], int) or sd[key] < 0:
            raise errors.InvalidArgumentError("%s: %r is %r, not a count" % (what, key, sd[key]))
    if "cursor" in sd and not isinstance(sd["cursor"], (str, bytes)):
        raise errors.InvalidArgumentError("%s: 'cursor' is not a cursor" % what)
    return sd


def job_checkpoint(job: str, cursors: List[str]) -> Dict[str, Any]:
    worlds = {cursor_info(c)["world_size"] for c in cursors}
    return {"batchwire_job": STATE_VERSION, "job": job,
            "world_size": worlds.pop() if len(worlds) == 1 else len(cursors),
            "cursors": [cursor_text(c) for c in cursors]}


def job_checkpoint_from(states: Iterable[Dict[str, Any]]) -> Dict[str, Any]:
    """The job-level checkpoint from every rank's state dict (any order): one per rank of
    the world, all of one job and at one (epoch, step), each with its cursor."""
    states = [check_state(s, "job_checkpoint_from") for s in states]
    if not states:
        raise errors.InvalidArgumentError("job_checkpoint_from: no state given")
    world = states[0]["world_size"]
    by_rank = {}
    for s in states:
        if s["job"] != states[0]["job"] or s["world_size"] != world:
            raise errors.InvalidArgumentError(
                "job_checkpoint_from: states of different jobs or world sizes (%s/%d and %s/%d)"
                % (states[0]["job"], world, s["job"], s["world_size"]))
        if "cursor" not in s:
            raise errors.InvalidArgumentError(
                "job_checkpoint_from: rank %d's state has no cursor (take it with "
                "Loader.state_dict())" % s["rank"])
        if s["rank"] in by_rank:
            raise errors.InvalidArgumentError("job_checkpoint_from: rank %d given twice" %
                                              s["rank"])
        by_rank[s["rank"]] = s
    missing = [r for r in range(world) if r not in by_rank]
    if missing:
        raise errors.InvalidArgumentError("job_checkpoint_from: ranks %s of world size %d are "
                                          "missing" % (missing, world))
    steps = {(s["epoch"], s["step"]) for s in states}
    if len(steps) > 1:
        raise errors.FailedPreconditionError(
            "job_checkpoint_from: the ranks stopped at different steps %s; take every rank's "
            "state after the same step" % sorted(steps))
    return job_checkpoint(states[0]["job"], [by_rank[r]["cursor"] for r in range(world)])


def elastic_cursors(resume: Any) -> List[bytes]:
    """The old world's cursors (binary) from what Loader(elastic=True, resume=...) accepts:
    None (the coordinator's committed cursors: an empty list), a job-level checkpoint, or a
    list of cursors or rank state dicts."""
    if resume is None:
        return []
    if isinstance(resume, dict):
        if resume.get("batchwire_job") != STATE_VERSION or "cursors" not in resume:
            raise errors.InvalidArgumentError(
                "resume with elastic=True: expected a job-level checkpoint (a dict with "
                "\"batchwire_job\": %d and \"cursors\", from batchwire.job_checkpoint() or "
                "job_checkpoint_from()) or a list of every rank's cursors or states"
                % STATE_VERSION)
        items = list(resume["cursors"])
    elif isinstance(resume, (list, tuple)):
        items = list(resume)
    else:
        raise errors.InvalidArgumentError(
            "resume with elastic=True: expected a job-level checkpoint or a list of every "
            "rank's cursors, got %s" % type(resume).__name__)
    if items and isinstance(items[0], dict):
        return [cursor_binary(c) for c in job_checkpoint_from(items)["cursors"]]
    return [cursor_binary(c) for c in items]
