"""The transforms (core/transform/, docs/transforms.md) against Pillow and torchvision on the
same JPEG files (issue 28's acceptance, item 2):

* the images: `batchwire gen --format jpeg` at two size ranges (1-40 and 64-640 px a side,
  every chroma subsampling) and JPEGs Pillow writes (grayscale, CMYK, progressive, 1x1,
  quality 100, 4:2:0 at odd sizes); the generator's sizes and pixels also checked against an
  independent numpy reading of docs/formats.md, `tar-jpeg` against `jpeg`, and both served by
  a worker (format files: the JPEG bytes; format tar: fields jpg and cls);
* decode equal to Image.open(f).convert("RGB") byte for byte;
* resize(S), resize(H,W) (down and up), center_crop (inside and larger than the image) and
  resized_crop (boxes partly outside) within 1 per channel value of torchvision's functional
  ops on the PIL image (measured: how many values differ at all);
* flip exact; normalize within 1 ulp of to_tensor + normalize in float32; cast(float16) and
  cast(bfloat16) equal to torch's conversions;
* random_resized_crop: the parameters drawn by an independent Python implementation of the
  PRNG and algorithm docs/transforms.md states (fallback included), applied exactly;
  deterministic for a key, different across indexes, epochs and seeds; distributed as
  torchvision's own draws (mean area share, log aspect ratio, fallback share);
* PNG decode equal to Image.open(f).convert("RGB") byte for byte on PNGs Pillow writes (RGB,
  RGBA, L, LA, 1, I;16, P at 1/2/4/8 bits, with tRNS transparency) and on PNGs written here
  from the PNG specification (16-bit RGB, RGBA, LA and gray, 2- and 4-bit gray, Adam7
  interlacing, every row filter, palette indexes past the PLTE);
* corrupt JPEGs and PNGs (truncated, garbage, empty, a bad chunk CRC) refused with an error
  naming the file, the index and the op, where Pillow refuses them too.
"""

import json
import math
import struct
import zlib
import os
import subprocess
import sys
import tarfile

import numpy as np
import torch
import torchvision.transforms.functional as F
from PIL import Image, JpegImagePlugin

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwdata as bd  # noqa: E402
import bwtest as bt  # noqa: E402

TOOL = os.path.join(bt.BUILD_DIR, "tests", "bw_transform_check")
M64 = (1 << 64) - 1
G = 0x9E3779B97F4A7C15
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
NORM = "normalize(0.485,0.456,0.406;0.229,0.224,0.225)"


mix = bd._mix_int  # splitmix64's finalizer (docs/formats.md)


# ---- docs/transforms.md, "Random choices", written from the document ----

class Rng:
    def __init__(self, seed, epoch, source, index, op):
        k = mix(seed ^ 0x5851F42D4C957F2D)
        for v, c in ((epoch, 1), (source, 2), (index, 3), (op, 4)):
            k = mix(k ^ ((v * G + c) & M64))
        self.key, self.n = k, 0

    def next(self):
        self.n += 1
        return mix(self.key + self.n * G)

    def uniform(self):
        return (self.next() >> 11) * 2.0 ** -53

    def below(self, n):
        threshold = (2 ** 64 - n) % n
        while True:
            x = self.next()
            if x >= threshold:
                return x % n


def rrc_params(rng, h, w, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    area = h * w
    lr0, lr1 = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * (scale[0] + (scale[1] - scale[0]) * rng.uniform())
        aspect = math.exp(lr0 + (lr1 - lr0) * rng.uniform())
        cw = round(math.sqrt(target * aspect))
        ch = round(math.sqrt(target / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            return [rng.below(h - ch + 1), rng.below(w - cw + 1), ch, cw]
    in_ratio = w / h
    cw, ch = w, h
    if in_ratio < ratio[0]:
        ch = round(w / ratio[0])
    elif in_ratio > ratio[1]:
        cw = round(h * ratio[1])
    ch, cw = max(ch, 1), max(cw, 1)
    return [(h - ch) // 2, (w - cw) // 2, ch, cw]


# ---- docs/formats.md, "Synthetic JPEG images", written from the document ----

def iword(seed, i, k):
    return mix(mix(seed ^ 0x632BE59BD9B4E019) + i * G + (k + 1) * 0xD1B54A32D192ED03)


def synth_image(seed, i, lo, hi):
    h = lo + iword(seed, i, 0) % (hi - lo + 1)
    w = lo + iword(seed, i, 1) % (hi - lo + 1)
    g = iword(seed, i, 4)
    y, x = np.mgrid[0:h, 0:w].astype(np.int64)
    t, T = [(x, w), (y, h), (x + y, w + h), (w - 1 - x + y, w + h)][g % 4]
    img = np.zeros((h, w, 3), np.int64)
    for c in range(3):
        c0, c1 = (g >> (8 * c)) & 255, (g >> (8 * c + 24)) & 255
        prod = (c1 - c0) * t
        img[..., c] = c0 + np.sign(prod) * (np.abs(prod) // T)  # truncating division
    side = min(h, w)
    for s in range(2 + iword(seed, i, 5) % 4):
        a, b = iword(seed, i, 6 + 2 * s), iword(seed, i, 7 + 2 * s)
        kind, cx, cy = a % 3, (a >> 8) % w, (a >> 24) % h
        r = 1 + (a >> 40) % (side // 2 + 1)
        if kind == 0:
            r2 = 1 + (b >> 24) % (side // 2 + 1)
            m = (abs(x - cx) <= r) & (abs(y - cy) <= r2)
        else:
            m = (x - cx) ** 2 + (y - cy) ** 2 <= r * r
            if kind == 2:
                m &= ((x + y) // 4) % 2 == 1
        for c in range(3):
            img[..., c][m] = (b >> (8 * c)) & 255
    noise = np.full(h * w, iword(seed, i, 1000), dtype=np.uint64)
    z = bd._mix(noise + np.arange(h * w, dtype=np.uint64) * np.uint64(G)).reshape(h, w)
    for c in range(3):
        img[..., c] += ((z >> np.uint64(8 * c)) % np.uint64(25)).astype(np.int64) - 12
    return np.clip(img, 0, 255).astype(np.uint8)


# ---- running the C side ----

def run_tool(tmpdir, spec, files, key=(0, 0, 0, 0)):
    out = os.path.join(tmpdir, "out")
    os.makedirs(out, exist_ok=True)
    argv = [TOOL, "--seed", str(key[0]), "--epoch", str(key[1]), "--source", str(key[2]),
            "--index", str(key[3]), spec, out] + files
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    bt.check(p.returncode in (0, 1), "bw_transform_check ran (%s)" % spec, p.stderr)
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    bt.check(len(rows) == len(files), "one result per file for %s" % spec, p.stdout + p.stderr)
    results = []
    for n, r in enumerate(rows):
        if not r["ok"]:
            results.append(r)
            continue
        dt = {"uint8": np.uint8, "float32": np.float32, "float16": np.float16,
              "bfloat16": np.uint16}[r["dtype"]]
        r["data"] = np.fromfile(os.path.join(out, "%d.raw" % n), dtype=dt).reshape(r["shape"])
        results.append(r)
    return results


def pil(path):
    with Image.open(path) as im:
        return im.convert("RGB")


def compare(what, got, ref, tol, stats):
    bt.check(got.shape == ref.shape, "%s: shape %s, torchvision %s" % (what, got.shape, ref.shape))
    d = np.abs(got.astype(np.int64) - ref.astype(np.int64))
    stats["values"] += d.size
    stats["differ"] += int((d > 0).sum())
    stats["max"] = max(stats["max"], int(d.max()) if d.size else 0)
    bt.check(int(d.max()) <= tol, "%s: max difference %d > %d" % (what, int(d.max()), tol))


def ulps(a, b):
    ia = a.astype(np.float32).view(np.int32).astype(np.int64)
    ib = b.astype(np.float32).view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return np.abs(ia - ib)


def make_images(tmpdir):
    files = []
    for name, lo, hi, n in (("small", 1, 40, 14), ("large", 64, 640, 14)):
        d = os.path.join(tmpdir, name)
        r = bt.cli("gen", "--format", "jpeg", "--out", d, "--num-samples", n, "--seed", 11,
                   "--image-min", lo, "--image-max", hi)
        bt.check(r.returncode == 0, "gen --format jpeg %s" % name, r.stderr)
        info = json.loads(r.stdout)
        bt.check(info["format"] == "files" and info["content"] == "jpeg" and info["seed"] == 11,
                 "gen's JSON line describes a files dataset of JPEGs", r.stdout)
        for i in range(n):
            path = os.path.join(d, "samples", "sample%08d.jpg" % i)
            files.append(path)
            # The documented quality and subsampling: Pillow re-saving the image with them
            # writes the same quantization tables and sampling factors.
            q = iword(11, i, 2)
            again = os.path.join(tmpdir, "again.jpg")
            pil(path).save(again, quality=75 + q % 21, subsampling=[0, 1, 2][(q >> 32) % 3])
            with Image.open(path) as a, Image.open(again) as b:
                bt.check(a.quantization == b.quantization and
                         JpegImagePlugin.get_sampling(a) == JpegImagePlugin.get_sampling(b),
                         "gen image %d: quality and subsampling as docs/formats.md states" % i)
    # The documented pixels, at quality 100 and 4:4:4, where TurboJPEG and Pillow encode alike.
    d = os.path.join(tmpdir, "q100")
    r = bt.cli("gen", "--format", "jpeg", "--out", d, "--num-samples", 12, "--seed", 11,
               "--image-min", 1, "--image-max", 90, "--quality", 100)
    bt.check(r.returncode == 0, "gen --quality 100", r.stderr)
    for i in range(12):
        ref = synth_image(11, i, 1, 90)
        again = os.path.join(tmpdir, "again.jpg")
        Image.fromarray(ref).save(again, quality=100, subsampling=0)
        got = np.asarray(pil(os.path.join(d, "samples", "sample%08d.jpg" % i)))
        bt.check(got.shape == ref.shape and np.array_equal(got, np.asarray(pil(again))),
                 "gen image %d (%s): pixels as docs/formats.md computes them" % (i, ref.shape))
    # Subsampling varies: Pillow reports it per file (0 4:4:4, 1 4:2:2, 2 4:2:0).
    subs = {JpegImagePlugin.get_sampling(Image.open(f)) for f in files}
    bt.check(subs == {0, 1, 2}, "gen varies the chroma subsampling (%s)" % subs)
    # Written by Pillow: the decoder's other paths.
    rng = np.random.default_rng(5)
    extra = os.path.join(tmpdir, "pillow")
    os.makedirs(extra)
    base = pil(files[-1])
    cases = [("gray.jpg", base.convert("L"), {}), ("cmyk.jpg", base.convert("CMYK"), {}),
             ("progressive.jpg", base, {"progressive": True}),
             ("q100.jpg", base, {"quality": 100, "subsampling": 0}),
             ("one.jpg", Image.fromarray(rng.integers(0, 256, (1, 1, 3), dtype=np.uint8)), {}),
             ("odd.jpg", Image.fromarray(rng.integers(0, 256, (17, 3, 3), dtype=np.uint8)),
              {"subsampling": 2}),
             ("gray1x7.jpg", Image.fromarray(rng.integers(0, 256, (1, 7), dtype=np.uint8)), {})]
    for name, im, kw in cases:
        path = os.path.join(extra, name)
        im.save(path, **kw)
        files.append(path)
    bt.check(Image.open(os.path.join(extra, "cmyk.jpg")).mode == "CMYK" and
             Image.open(os.path.join(extra, "gray.jpg")).mode == "L",
             "the CMYK and grayscale JPEGs are read as such by Pillow")
    return files


# ---- PNGs written from the PNG specification (what Pillow cannot write) ----

ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
         (0, 1, 1, 2))  # x0, y0, dx, dy of the seven passes


def png_filter(raw, prev, ft, bpp):
    out = bytearray([ft])
    for i, x in enumerate(raw):
        a = raw[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if ft == 0:
            p = 0
        elif ft == 1:
            p = a
        elif ft == 2:
            p = b
        elif ft == 3:
            p = (a + b) // 2
        else:  # Paeth
            pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
            p = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
        out.append((x - p) & 255)
    return out


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bytes(a, depth, ctype, interlace=False, plte=b"", seed=0):
    """a: H x W x channels of values below 2**depth; every row gets a random filter."""
    h, w, ch = a.shape
    bpp = max(1, ch * depth // 8)
    rng = np.random.default_rng(seed)
    data = bytearray()
    for x0, y0, dx, dy in (ADAM7 if interlace else ((0, 0, 1, 1),)):
        sub = a[y0::dy, x0::dx]
        if sub.size == 0:
            continue
        prev = None
        for row in sub:
            if depth == 16:
                raw = row.astype(">u2").tobytes()
            elif depth == 8:
                raw = row.astype(np.uint8).tobytes()
            else:
                bits = np.unpackbits(row.reshape(-1, 1).astype(np.uint8), axis=1)[:, 8 - depth:]
                raw = np.packbits(bits.reshape(-1)).tobytes()
            prev = prev or bytes(len(raw))
            data += png_filter(raw, prev, int(rng.integers(0, 5)), bpp)
            prev = raw
    ihdr = struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, int(interlace))
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) +
            (png_chunk(b"PLTE", plte) if plte else b"") +
            png_chunk(b"IDAT", zlib.compress(bytes(data))) + png_chunk(b"IEND", b""))


def make_pngs(tmpdir, files):
    d = os.path.join(tmpdir, "png")
    os.makedirs(d)
    rng = np.random.default_rng(8)
    paths = []

    def put(name, data=None, im=None, **kw):
        path = os.path.join(d, name)
        if im is not None:
            im.save(path, **kw)
        else:
            open(path, "wb").write(data)
        paths.append(path)

    def rand(*shape, hi=256):
        return rng.integers(0, hi, shape, dtype=np.uint16 if hi > 256 else np.uint8)

    # Written by Pillow.
    photo = pil(files[-10])
    put("rgb.png", im=photo)
    put("rgb_trns.png", im=Image.fromarray(rand(23, 31, 3)), transparency=(1, 2, 3))
    put("rgba.png", im=Image.fromarray(rand(23, 31, 4)))
    put("gray.png", im=photo.convert("L"))
    put("gray_trns.png", im=Image.fromarray(rand(9, 40)), transparency=7)
    put("la.png", im=Image.fromarray(rand(23, 31, 2), "LA"))
    put("bilevel.png", im=Image.fromarray(rand(17, 13)).convert("1"))
    put("gray16.png", im=Image.fromarray(rand(23, 31, hi=65536)))  # mostly over 255
    put("gray16_low.png", im=Image.fromarray(rand(23, 31, hi=300)))
    for colors in (2, 4, 16, 256):  # Pillow writes 1, 2, 4 and 8 bits per index
        put("p%d.png" % colors, im=Image.fromarray(rand(23, 31, 3)).quantize(colors))
    put("p_trns.png", im=Image.fromarray(rand(23, 31, 3)).quantize(16), transparency=3)
    put("one.png", im=Image.fromarray(rand(1, 1, 3)))
    # Written here.
    put("rgb16.png", png_bytes(rand(29, 37, 3, hi=65536), 16, 2, seed=1))
    put("rgba16.png", png_bytes(rand(29, 37, 4, hi=65536), 16, 6, seed=2))
    put("la16.png", png_bytes(rand(29, 37, 2, hi=65536), 16, 4, seed=3))
    put("gray2.png", png_bytes(rand(29, 37, 1, hi=4), 2, 0, seed=4))
    put("gray4.png", png_bytes(rand(29, 37, 1, hi=16), 4, 0, seed=5))
    put("rgb_adam7.png", png_bytes(rand(29, 37, 3), 8, 2, interlace=True, seed=6))
    put("p4_adam7.png", png_bytes(rand(29, 37, 1, hi=16), 4, 3, interlace=True,
                                  plte=bytes(rand(48)), seed=7))
    put("gray16_adam7.png", png_bytes(rand(11, 5, 1, hi=600), 16, 0, interlace=True, seed=8))
    put("rgba_adam7_1x1.png", png_bytes(rand(1, 1, 4), 8, 6, interlace=True, seed=9))
    # Indexes up to 255 with a PLTE of 5 entries: Pillow reads the others as gray (i, i, i).
    put("p_short_plte.png", png_bytes(rand(9, 33, 1), 8, 3, plte=bytes(rand(15)), seed=10))
    modes = {os.path.basename(p): Image.open(p).mode for p in paths}
    bt.check({"RGB", "RGBA", "L", "LA", "1", "I", "P"} <= set(modes.values()),
             "the PNGs cover Pillow's modes", modes)
    return paths


def check_png(tmpdir, files):
    pngs = make_pngs(tmpdir, files)
    check_decode(tmpdir, pngs, "PNGs")
    # A pipeline on them is the JPEG's pipeline on the same pixels.
    spec = "resized_crop(-2,3,20,25,12,14)|flip(1)|" + NORM
    for path, r in zip(pngs, run_tool(tmpdir, "decode|" + spec, pngs)):
        bt.check(r["ok"], "%s on %s" % (spec, path), r.get("error"))
        ref = F.normalize(F.to_tensor(F.hflip(F.resized_crop(pil(path), -2, 3, 20, 25, [12, 14]))),
                          MEAN, STD).permute(1, 2, 0).numpy()
        bt.check(r["data"].shape == ref.shape and int(ulps(r["data"], ref).max()) == 0,
                 "%s on %s equals torchvision's" % (spec, path))
    bt.ok("PNG pipelines (%s) equal torchvision's on %d PNGs" % (spec, len(pngs)))


def check_decode(tmpdir, files, what="JPEGs"):
    res = run_tool(tmpdir, "decode", files)
    for path, r in zip(files, res):
        bt.check(r["ok"], "decode %s" % path, r.get("error"))
        ref = np.asarray(pil(path))
        bt.check(r["data"].shape == ref.shape and np.array_equal(r["data"], ref),
                 "decode %s equals Pillow's byte for byte (max diff %s)" %
                 (path, np.abs(r["data"].astype(int) - ref).max()
                  if r["data"].shape == ref.shape else "shape"))
    bt.ok("decode: %d %s equal to Pillow's Image.open(f).convert('RGB') byte for byte"
          % (len(files), what))


def check_geometry(tmpdir, files):
    stats = {"values": 0, "differ": 0, "max": 0}
    cases = [("resize(7)", lambda im: F.resize(im, 7)),
             ("resize(33)", lambda im: F.resize(im, 33)),
             ("resize(224)", lambda im: F.resize(im, 224)),
             ("resize(700)", lambda im: F.resize(im, 700)),
             ("resize(1,1)", lambda im: F.resize(im, [1, 1])),
             ("resize(50,20)", lambda im: F.resize(im, [50, 20])),
             ("resize(301,517)", lambda im: F.resize(im, [301, 517])),
             ("center_crop(224)", lambda im: F.center_crop(im, [224, 224])),
             ("center_crop(31,17)", lambda im: F.center_crop(im, [31, 17])),
             ("center_crop(1000,5)", lambda im: F.center_crop(im, [1000, 5])),
             ("resized_crop(-3,5,30,200,24,24)",
              lambda im: F.resized_crop(im, -3, 5, 30, 200, [24, 24])),
             ("resized_crop(10,-20,1,1,9,11)",
              lambda im: F.resized_crop(im, 10, -20, 1, 1, [9, 11])),
             ("resized_crop(2,3,97,61,50)", lambda im: F.resized_crop(im, 2, 3, 97, 61, 50)),
             ("resized_crop(0,0,300,300,224,224)",
              lambda im: F.resized_crop(im, 0, 0, 300, 300, [224, 224]))]
    for spec, fn in cases:
        res = run_tool(tmpdir, "decode|" + spec, files)
        for path, r in zip(files, res):
            bt.check(r["ok"], "%s on %s" % (spec, path), r.get("error"))
            compare("%s on %s" % (spec, path), r["data"], np.asarray(fn(pil(path))), 1, stats)
    # Crops with random boxes, partly outside the image, random output sizes.
    rng = np.random.default_rng(3)
    for k in range(12):
        h, w = int(rng.integers(1, 400)), int(rng.integers(1, 400))
        top, left = int(rng.integers(-50, 300)), int(rng.integers(-50, 300))
        oh, ow = int(rng.integers(1, 300)), int(rng.integers(1, 300))
        spec = "resized_crop(%d,%d,%d,%d,%d,%d)" % (top, left, h, w, oh, ow)
        sub = files[k::12]
        for path, r in zip(sub, run_tool(tmpdir, "decode|" + spec, sub)):
            ref = F.resized_crop(pil(path), top, left, h, w, [oh, ow])
            compare("%s on %s" % (spec, path), r["data"], np.asarray(ref), 1, stats)
    bt.ok("resize, center_crop, resized_crop: %d values compared with torchvision, %d differ "
          "(max %d)" % (stats["values"], stats["differ"], stats["max"]))
    bt.check(stats["differ"] == 0, "resize and crops equal to Pillow/torchvision bit for bit")
    return stats


def check_flip_normalize_cast(tmpdir, files):
    for spec, flipped in (("flip(1)", True), ("flip(0)", False)):
        for path, r in zip(files, run_tool(tmpdir, "decode|" + spec, files)):
            ref = F.hflip(pil(path)) if flipped else pil(path)
            bt.check(np.array_equal(r["data"], np.asarray(ref)), "%s on %s exact" % (spec, path))
            bt.check(r["draws"] == [{"op": 1, "flipped": int(flipped)}], "%s draws" % spec,
                     r["draws"])
    worst = 0
    for layout in ("|chw", ""):
        for path, r in zip(files, run_tool(tmpdir, "decode|" + NORM + layout, files)):
            ref = F.normalize(F.to_tensor(pil(path)), MEAN, STD).numpy()
            if not layout:
                ref = ref.transpose(1, 2, 0)
            bt.check(r["data"].shape == ref.shape, "normalize%s shape on %s" % (layout, path))
            worst = max(worst, int(ulps(r["data"], ref).max()))
    bt.check(worst <= 1, "normalize within 1 ulp of torchvision's (worst %d)" % worst)
    bt.ok("flip exact; normalize: worst difference %d ulp (HWC and CHW)" % worst)
    for t, tt in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        for path, r in zip(files[:6], run_tool(tmpdir, "decode|" + NORM + "|chw|cast(%s)" % t,
                                               files[:6])):
            ref = F.normalize(F.to_tensor(pil(path)), MEAN, STD).to(tt)
            ref = ref.view(torch.int16).numpy().view(np.uint16)
            bt.check(np.array_equal(r["data"].view(np.uint16), ref),
                     "cast(%s) on %s equals torch's conversion" % (t, path))
    bt.ok("cast(float16), cast(bfloat16) equal to torch's .to()")


def check_random(tmpdir, files):
    # The PRNG and algorithm from the document against the C side, fallback included.
    for h, w, sc, ra in ((480, 640, (0.08, 1), (0.75, 4 / 3)), (7, 1000, (0.08, 1), (0.75, 4 / 3)),
                         (1000, 3, (0.5, 1), (0.75, 4 / 3)), (1, 1, (0.08, 1), (0.75, 4 / 3)),
                         (300, 200, (0.9, 1), (2.0, 3.0)), (50, 50, (0.01, 0.02), (0.1, 10))):
        p = subprocess.run([TOOL, "--rrc-params", str(h), str(w), repr(sc[0]), repr(sc[1]),
                            repr(ra[0]), repr(ra[1]), "200", "--seed", "77"],
                           capture_output=True, text=True, timeout=60)
        got = [[int(v) for v in line.split()] for line in p.stdout.splitlines()]
        want = [rrc_params(Rng(77, 0, 0, i, 0), h, w, sc, ra) for i in range(200)]
        bt.check(got == want, "random_resized_crop boxes for %dx%d %s %s as docs/transforms.md "
                 "computes them" % (h, w, sc, ra),
                 [(i, a, b) for i, (a, b) in enumerate(zip(got, want)) if a != b][:5])
    # Same distribution as torchvision's own draws (its generator, not ours): mean crop area
    # share, mean log aspect ratio and the share of fallbacks, 20,000 draws each.
    import torchvision.transforms as T
    torch.manual_seed(0)
    for h, w in ((480, 640), (100, 1000)):
        p = subprocess.run([TOOL, "--rrc-params", str(h), str(w), "0.08", "1", repr(3 / 4),
                            repr(4 / 3), "20000", "--seed", "5"],
                           capture_output=True, text=True, timeout=60)
        ours = np.array([[int(v) for v in line.split()] for line in p.stdout.splitlines()])
        img = torch.empty(1, h, w)
        tv = np.array([T.RandomResizedCrop.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3])
                       for _ in range(20000)])
        fb = rrc_params(Rng(0, 0, 0, 0, 0), h, w, (2.0, 2.0))  # every try misses
        for name, f, tol in (("area share", lambda b: b[:, 2] * b[:, 3] / (h * w), 0.01),
                             ("log aspect", lambda b: np.log(b[:, 3] / b[:, 2]), 0.01),
                             ("fallback share", lambda b: (b == fb).all(axis=1), 0.02)):
            a, b = float(f(ours).mean()), float(f(tv).mean())
            bt.check(abs(a - b) < tol, "random_resized_crop on %dx%d: mean %s %.4f, torchvision's "
                     "%.4f" % (h, w, name, a, b))
    # A whole training pipeline, its draws re-derived and applied with torchvision.
    spec = "decode|random_resized_crop(224)|flip(0.5)|" + NORM + "|chw"
    key = (1234, 3, 2, 500)
    res = run_tool(tmpdir, spec, files, key)
    worst, flips = 0, 0
    for n, (path, r) in enumerate(zip(files, res)):
        im = pil(path)
        box = rrc_params(Rng(key[0], key[1], key[2], key[3] + n, 1), im.height, im.width)
        flip = Rng(key[0], key[1], key[2], key[3] + n, 2).uniform() < 0.5
        bt.check(r["draws"] == [{"op": 1, "box": box}, {"op": 2, "flipped": int(flip)}],
                 "draws of %s as documented" % path, (r["draws"], box, flip))
        ref = F.resized_crop(im, *box, [224, 224])
        ref = F.hflip(ref) if flip else ref
        ref = F.normalize(F.to_tensor(ref), MEAN, STD).numpy()
        worst = max(worst, int(ulps(r["data"], ref).max()))
        flips += flip
    bt.check(worst <= 1, "random_resized_crop|flip|normalize equal to torchvision with the same "
             "parameters (worst %d ulp)" % worst)
    bt.check(0 < flips < len(files), "flip(0.5) flips some images, not all (%d)" % flips)
    again = run_tool(tmpdir, spec, files, key)
    bt.check(all(np.array_equal(a["data"], b["data"]) for a, b in zip(res, again)),
             "the same key gives the same bytes")
    for other in ((1235, 3, 2, 500), (1234, 4, 2, 500), (1234, 3, 3, 500), (1234, 3, 2, 501)):
        o = run_tool(tmpdir, spec, files[:8], other)
        same = sum(a["draws"] == b["draws"] for a, b in zip(res[:8], o))
        bt.check(same == 0, "key %s draws differently from %s (%d of 8 the same)" %
                 (other, key, same))
    bt.ok("random_resized_crop: documented PRNG and algorithm reproduced in Python; applied "
          "result within %d ulp of torchvision's; deterministic per key" % worst)


def check_corrupt(tmpdir, files):
    d = os.path.join(tmpdir, "corrupt")
    os.makedirs(d)
    good = open(files[-8], "rb").read()
    cases = {"truncated.jpg": good[:len(good) // 2], "garbage.jpg": b"\xff\xd8" + np.random.default_rng(9).bytes(500),
             "empty.jpg": b"", "text.jpg": b"hello, not an image\n"}
    png = png_bytes(np.arange(300, dtype=np.uint8).reshape(10, 10, 3), 8, 2)
    bad_crc = bytearray(png)
    bad_crc[8 + 8 + 13] ^= 1  # IHDR's CRC
    text = bytearray(png_chunk(b"tEXt", b"key\x00value"))
    text[-1] ^= 1  # an ancillary chunk's CRC, before the image data: Pillow checks it
    cases.update({"truncated.png": png[:len(png) - 30], "garbage.png": png[:8] + good[:300],
                  "bad_crc.png": bytes(bad_crc), "no_idat.png": png[:33] + png[-12:],
                  "bad_text_crc.png": png[:33] + bytes(text) + png[33:]})
    paths = []
    for name, data in cases.items():
        path = os.path.join(d, name)
        open(path, "wb").write(data)
        paths.append(path)
        pillow_ok = True
        try:
            with Image.open(path) as im:
                im.convert("RGB")
        except Exception:
            pillow_ok = False
        bt.check(not pillow_ok, "Pillow refuses %s too" % name)
    res = run_tool(tmpdir, "decode|resize(32)", paths, (0, 0, 0, 40))
    for n, (name, path, r) in enumerate(zip(cases, paths, res)):
        bt.check(not r["ok"], "%s refused" % path)
        e = r["error"]
        bt.check(path in e and "(index %d)" % (40 + n) in e and "op 1: decode:" in e,
                 "the error names the file, the index and the op", e)
        bt.check(("corrupt PNG" in e) == name.endswith(".png"), "the error says what the file "
                 "was read as", e)
    bt.ok("corrupt JPEGs and PNGs refused: %s" % "; ".join(r["error"] for r in res))
    # The one documented difference: Pillow does not check the image data's CRC, libpng does.
    idat = bytearray(png)
    idat[-13] ^= 1  # the last byte of IDAT's CRC (IEND's 12 bytes follow)
    path = os.path.join(d, "bad_idat_crc.png")
    open(path, "wb").write(bytes(idat))
    r = run_tool(tmpdir, "decode", [path])[0]
    bt.check(not r["ok"] and "IDAT: CRC error" in r["error"] and pil(path).size == (10, 10),
             "a bad IDAT CRC: refused here, decoded by Pillow (docs/transforms.md)", r)
    # Damage inside the entropy-coded data is a libjpeg warning: Pillow decodes such a file
    # (with garbage where the damage is), and so does decode, to the same pixels.
    damaged = bytearray(good)
    for k in range(len(good) // 2, len(good) // 2 + 40, 3):
        damaged[k] ^= 0x5A
    path = os.path.join(d, "damaged.jpg")
    open(path, "wb").write(bytes(damaged))
    r = run_tool(tmpdir, "decode", [path])[0]
    bt.check(r["ok"] and np.array_equal(r["data"], np.asarray(pil(path))),
             "a JPEG damaged inside its scan decodes as Pillow decodes it", r.get("error"))


def check_tar(tmpdir, files):
    d = os.path.join(tmpdir, "wds")
    r = bt.cli("gen", "--format", "tar-jpeg", "--out", d, "--num-samples", 14, "--seed", 11,
               "--image-min", 1, "--image-max", 40, "--files", 3)
    bt.check(r.returncode == 0, "gen --format tar-jpeg", r.stderr)
    info = json.loads(r.stdout)
    bt.check(info["format"] == "tar" and len(info["sources"]) == 3, "three tar shards", r.stdout)
    names = []
    for s in info["sources"]:
        with tarfile.open(os.path.join(d, s)) as t:
            for m in t.getmembers():
                names.append(m.name)
                data = t.extractfile(m).read()
                i = int(m.name[6:14])
                if m.name.endswith(".jpg"):
                    bt.check(data == open(files[i], "rb").read(),
                             "%s is the jpeg format's image %d" % (m.name, i))
                else:
                    bt.check(data == str(iword(11, i, 3) % 10).encode(),
                             "%s holds the documented class" % m.name)
    bt.check(names == ["sample%08d.%s" % (i, e) for i in range(14) for e in ("jpg", "cls")],
             "tar-jpeg members in sample order, jpg then cls", names)
    bt.ok("tar-jpeg: WebDataset shards of the same JPEGs with their classes")
    bad = os.path.join(tmpdir, "bad")
    r = bt.cli("gen", "--format", "jpeg", "--out", bad, "--image-min", 100, "--image-max", 50)
    bt.check(r.returncode == 2 and "--image-min 100 is larger than --image-max 50" in r.stderr
             and not os.path.exists(bad), "gen refuses --image-min > --image-max, writing nothing",
             r.stderr)


def check_served(tmpdir, files):
    """gen's two layouts are datasets a worker serves: files (one JPEG each) and tar (jpg and
    cls fields per WebDataset sample)."""
    coord = bt.coordinator(tmpdir)
    w = bt.worker(tmpdir, coord.addr, "w1", data_root=tmpdir)
    c = bd.DataClient(tmpdir, w.addr)
    info = c.describe("files", ["small/samples"])
    bt.check(info.length == 14, "the jpeg output is a files dataset of 14 samples", info)
    got = c.read("files", ["small/samples"], list(range(14)))
    bt.check([g["data"] for g in got] == [open(f, "rb").read() for f in files[:14]],
             "a worker serves gen's JPEG files as they are")
    info = c.describe("tar", ["wds/shard-*.tar"])
    bt.check(info.length == 14, "the tar-jpeg output is a tar dataset of 14 samples", info)
    got = c.read("tar", ["wds/shard-*.tar"], list(range(14)))
    for i, g in enumerate(got):
        jpg = open(files[i], "rb").read()
        cls = str(iword(11, i, 3) % 10).encode()
        bt.check(g["fields"] == [("jpg", len(jpg)), ("cls", len(cls))] and
                 g["data"] == jpg + cls,
                 "WebDataset sample %d served as fields jpg and cls" % i, g["fields"])
    c.close()
    bt.ok("gen's jpeg and tar-jpeg outputs served by a worker as files and tar datasets")


def test(tmpdir):
    bt.check(os.access(TOOL, os.X_OK), "%s is built" % TOOL)
    files = make_images(tmpdir)
    check_decode(tmpdir, files)
    check_geometry(tmpdir, files)
    check_flip_normalize_cast(tmpdir, files)
    check_random(tmpdir, files)
    check_png(tmpdir, files)
    check_corrupt(tmpdir, files)
    check_tar(tmpdir, files)
    check_served(tmpdir, files)


if __name__ == "__main__":
    bt.main(test, timeout=500)
