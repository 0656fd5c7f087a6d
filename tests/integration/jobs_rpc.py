"""A small client of the coordinator's Jobs service for tests and benchmarks (not a test).

Python stubs for proto/jobs.proto, data.proto, batchwire.proto and health.proto (pb, dpb, bpb,
hpb) are generated with Debian's protoc into a temporary directory at import time; calls go through python3-grpcio
by method path, so no grpc plugin is needed.
"""

import os
import subprocess
import sys
import tempfile

import grpc

SOURCE_DIR = os.environ.get(
    "BW_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PROTO_DIR = os.path.join(SOURCE_DIR, "proto")

_gen = tempfile.mkdtemp(prefix="bw-pb2-")
subprocess.run(["protoc", "--python_out=" + _gen, "-I", PROTO_DIR] +
               [os.path.join(PROTO_DIR, p) for p in
                ("jobs.proto", "data.proto", "batchwire.proto", "health.proto")], check=True)
sys.path.insert(0, _gen)
import jobs_pb2 as pb  # noqa: E402
import data_pb2  # noqa: E402
import batchwire_pb2  # noqa: E402
import health_pb2  # noqa: E402

# short names for the tests (jr.dpb, jr.bpb, jr.hpb)
dpb, bpb, hpb = data_pb2, batchwire_pb2, health_pb2

TORCH = pb.SAMPLER_MODE_TORCH
ACCELERATE = pb.SAMPLER_MODE_ACCELERATE
ITERABLE = pb.SAMPLER_MODE_ITERABLE


class CallError(Exception):
    """A failed call: .code (grpc.StatusCode), .bw (batchwire code name), .details."""

    def __init__(self, e):
        self.code = e.code()
        self.details = e.details() or ""
        md = dict(e.trailing_metadata() or ())
        self.bw = md.get("bw-error", "")
        super().__init__("%s %s: %s" % (self.code.name, self.bw, self.details))


_RESP = {
    "GetOrCreateJob": pb.GetOrCreateJobResponse,
    "JoinJob": pb.JoinJobResponse,
    "LeaseHeartbeat": pb.LeaseHeartbeatResponse,
    "CommitCursor": pb.CommitCursorResponse,
    "GetJob": pb.GetJobResponse,
    "ListJobs": pb.ListJobsResponse,
    "ResumeElastic": pb.ResumeElasticResponse,
    "LeaveJob": pb.LeaveJobResponse,
}


class Jobs:
    def __init__(self, addr, timeout=10.0, token=None):
        self.addr = addr
        self.timeout = timeout
        # a bearer token for a coordinator with --auth-tokens (docs/security.md)
        self.metadata = [("authorization", "Bearer " + token)] if token else None
        self.channel = grpc.insecure_channel(addr)
        self._stubs = {
            m: self.channel.unary_unary("/batchwire.v1.Jobs/" + m,
                                        request_serializer=lambda x: x.SerializeToString(),
                                        response_deserializer=r.FromString)
            for m, r in _RESP.items()
        }

    def close(self):
        self.channel.close()

    def call(self, method, req, timeout=None):
        try:
            return self._stubs[method](req, timeout=timeout or self.timeout,
                                       metadata=self.metadata)
        except grpc.RpcError as e:
            raise CallError(e) from None

    def expect_error(self, method, req, code=None, timeout=None):
        """Calls and returns the CallError; fails if the call succeeded."""
        try:
            r = self.call(method, req, timeout=timeout)
        except CallError as e:
            if code is not None and e.code != code:
                raise AssertionError("%s: expected %s, got %s" % (method, code, e))
            return e
        raise AssertionError("%s succeeded unexpectedly: %r" % (method, r))

    # conveniences
    def create(self, name, samples=1000, batch=4, world=2, shuffle=True, seed=7,
               mode=TORCH, **sampler):
        cfg = pb.JobConfig(synthetic_samples=samples,
                           sampler=pb.SamplerConfig(mode=mode, batch_size=batch, shuffle=shuffle,
                                                    seed=seed, **sampler))
        return self.call("GetOrCreateJob",
                         pb.GetOrCreateJobRequest(name=name, config=cfg, world_size=world))

    def join(self, job, rank, world, host="host-a", pid=1000):
        return self.call("JoinJob", pb.JoinJobRequest(job=job, rank=rank, world_size=world,
                                                      holder=pb.Holder(host=host, pid=pid)))

    def commit(self, job, rank, lease, cursor):
        return self.call("CommitCursor", pb.CommitCursorRequest(job=job, rank=rank, cursor=cursor,
                                                                **lease_fields(lease)))

    def heartbeat(self, job, rank, lease):
        return self.call("LeaseHeartbeat", pb.LeaseHeartbeatRequest(job=job, rank=rank,
                                                                    **lease_fields(lease)))

    def leave(self, job, rank, lease, finished=False):
        return self.call("LeaveJob", pb.LeaveJobRequest(job=job, rank=rank, finished=finished,
                                                        **lease_fields(lease)))

    def get(self, name):
        return self.call("GetJob", pb.GetJobRequest(name=name))

    def list(self):
        return self.call("ListJobs", pb.ListJobsRequest())

    def resume(self, job, world, cursors):
        return self.call("ResumeElastic", pb.ResumeElasticRequest(job=job, world_size=world,
                                                                  cursors=cursors))


def seal_cursor(body):
    """Appends the cursor's checksum field (15, fixed32): CRC-32C of the bytes before it."""
    from bwdata import crc32c
    return body + b"\x7d" + crc32c(body).to_bytes(4, "little")


def cursor(fingerprint, job, rank, world, epoch, step):
    """A packed cursor, as a trainer's client library makes it."""
    return seal_cursor(pb.Cursor(version=1, job=job, job_fingerprint=fingerprint, rank=rank,
                                 world_size=world, epoch=epoch, step=step).SerializeToString())


def decode_cursor(data):
    c = pb.Cursor()
    c.ParseFromString(data)
    return c


def lease(x):
    """A lease id (128 bits: lease_id, lease_id_hi) from a JoinJobResponse, as a tuple."""
    return (x.lease_id, x.lease_id_hi)


def lease_fields(x):
    """The request fields for a lease given as a JoinJobResponse or a (lo, hi) tuple."""
    lo, hi = x if isinstance(x, tuple) else lease(x)
    return {"lease_id": lo, "lease_id_hi": hi}
