"""Samples as named fields (python/README.md, "Fields"; docs/formats.md, "Field tables"):
WebDataset (tar) members and JSON Lines keys, with a keys= filter, from the C API's
per-field offsets (bw_batch_fields).

A coordinator and two workers on loopback serve `batchwire gen` datasets: tar (members
sampleN.bin and sampleN.json = {"index": N}) and JSON Lines ({"index": N, "hex": ...}), whose
bytes the test computes itself (bwdata, independent of the C generator).

* tar, map-style (torch mode, shuffled) over the data channel and over gRPC, and as a stream
  (iterable mode, two sources): batch.fields() gives {"bin": bytes, "json": bytes} per
  sample, equal to the expected members; keys=["json"] keeps only that member; a missing key
  is named in NotFoundError; samples() is still the members' bytes concatenated (the field
  table travels in front of the sample and is stripped).
* JSON Lines: fields() decodes each top-level key ({"index": N, "hex": "..."}); keys=["index"]
  decodes only that value.
* batchwire.torch.BatchDataset(keys=[...], samples=True) under DataLoader(batch_size=4,
  num_workers=2): dicts of the chosen fields, in plan order.
* fields=True on an .npy dataset is refused, naming the formats that have fields.
"""

import bwdata
import bwpy
import bwtest as bt

N = 37
LO, HI = 5, 40


def test(tmpdir):
    batchwire, root, _arr, coord = bwpy.npy_cluster(tmpdir, 8, (2,))
    for fmt, files in (("tar", 2), ("jsonl", 1)):
        bwpy.gen(root, fmt, fmt, N, LO, HI, files)

    def want_tar(i):
        data, fields = bwdata.expected_sample("tar", i, LO, HI)
        out, at = {}, 0
        for name, size in fields:
            out[name] = data[at:at + size]
            at += size
        return out, data

    def loader(job, dataset, **kw):
        o = dict(coordinator=coord.addr, job=job, dataset=dataset, batch_size=4, rank=0,
                 world_size=1)
        o.update(kw)
        return batchwire.Loader(**o)

    for label, kw in (("map-style, data channel", dict(shuffle=True, seed=2)),
                      ("map-style, gRPC", dict(shuffle=True, seed=2, transport="grpc")),
                      ("stream (iterable)", dict(mode="iterable"))):
        job = "tar-" + label.split(",")[0].split(" ")[0] + kw.get("transport", "")
        seen = set()
        with loader(job, "tar:tar/*", **kw) as lo:
            bad = []
            for b in lo:
                f_all, f_json, raw = b.fields(), b.fields(keys=["json"]), b.samples()
                for j, i in enumerate(b.indices.tolist()):
                    fields, data = want_tar(i)
                    if f_all[j] != fields or f_json[j] != {"json": fields["json"]} or \
                            raw[j] != data:
                        bad.append(i)
                    seen.add(i)
            bt.check(not bad and len(seen) == N, "tar, %s: every sample's fields() = "
                     "{bin, json} members, keys=['json'] only that one, samples() the members "
                     "concatenated (%d samples)" % (label, len(seen)), bad[:5])
    with loader("tar-missing", "tar:tar/*") as lo:
        b = lo.next_batch()
        try:
            b.fields(keys=["jpg"])
            raise bt.TestFailure("a missing field was not reported")
        except batchwire.NotFoundError as e:
            bt.check("'jpg'" in e.message and "bin" in e.message,
                     "keys=['jpg'] on samples without it: NotFoundError naming what they have: "
                     "%s" % e.message)

    with loader("lines", "jsonl:jsonl/*", shuffle=True, seed=3) as lo:
        bad, n = [], 0
        for b in lo:
            f_all, f_idx = b.fields(), b.fields(keys=["index"])
            for j, i in enumerate(b.indices.tolist()):
                data = bwdata.synth_bytes(i, bwdata.synth_len(i, LO, HI))
                if f_all[j] != {"index": i, "hex": data.hex()} or f_idx[j] != {"index": i}:
                    bad.append(i)
                n += 1
        bt.check(not bad and n == N, "JSON Lines: fields() decodes each key, keys=['index'] "
                 "only that one (%d samples)" % n, bad[:5])

    # batchwire.torch with keys= under DataLoader workers.
    import batchwire.torch as bwt
    from torch.utils.data import DataLoader
    ds = bwt.BatchDataset(coordinator=coord.addr, job="tar-dl", dataset="tar:tar/*",
                          batch_size=4, rank=0, world_size=1, shuffle=True, seed=5,
                          samples=True, keys=["json"])
    got = [d for b in DataLoader(ds, batch_size=4, collate_fn=list, num_workers=2) for d in b]
    plan = bwpy.plan("--mode", "torch", "--num-samples", N, "--world-size", 1, "--batch-size", 4,
                     "--shuffle", "--seed", 5)[0]
    order = [i for p in plan for i in p["indices"]]
    bt.check(got == [{"json": want_tar(i)[0]["json"]} for i in order],
             "BatchDataset(samples=True, keys=['json']) under DataLoader(batch_size=4, "
             "num_workers=2): each "
             "sample's json member, in plan order (%d samples)" % len(got))

    try:
        loader("npy-fields", bwpy.NPY, fields=True)
        raise bt.TestFailure("fields=True on an .npy dataset was accepted")
    except batchwire.InvalidArgumentError as e:
        bt.check("tar" in e.message and "jsonl" in e.message,
                 "fields=True on .npy is refused: %s" % e.message)


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=300)
