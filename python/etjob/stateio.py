"""etjob's state format: a state as a JSON header plus its tensors' bytes.

A state is what etjob.elastic.State commits and moves: nested dicts, lists
and tuples whose leaves are tensors and JSON scalars (a model's and an
optimizer's state_dict, an ElasticSampler's, the step). flatten() splits it
into a header, which says the tree, every tensor's dtype and shape and every
scalar's value, and the list of its tensors; unflatten() builds it back. No
pickle is involved: reading a peer's state runs no code of that peer's
(torch.load of a peer's bytes would, and weights_only is neither the default
nor safe on torch 1.13).

The value types a state may hold (anything else is refused by flatten with
the path of the value):
  - torch.Tensor (dense, strided; moved to the CPU, made contiguous);
  - dict, whose keys are str, int, float, bool or None (an optimizer's
    state_dict has int keys);
  - list and tuple;
  - int, float (inf and nan too), str, bool, None.

The tensors' bytes move as one byte stream, cut into chunks of a bounded size
(segments/pack/unpack), so a multi-GB state needs no second copy of itself.
"""

import json

import torch

#: The format's name and version, in every header: a reader refuses others.
FORMAT, VERSION = "etjob-state", 1

SUPPORTED = "tensors, dicts (str, int, float, bool or None keys), lists, tuples, int, float, str, bool and None"

_KEYS = (str, int, float, bool, type(None))


class FormatError(ValueError):
    """A state that cannot be written in the format, or a header that is not one."""


def flatten(obj):
    """flatten returns (header, tensors) for obj: the header is JSON-able."""
    tensors, metas = [], []

    def walk(v, path):
        if isinstance(v, torch.Tensor):
            if v.layout != torch.strided or v.is_quantized:
                raise FormatError("%s: a %s tensor; only dense tensors are supported" % (path, v.layout))
            t = v.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            tensors.append(t.contiguous())
            metas.append({"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)})
            return {"T": len(tensors) - 1}
        if isinstance(v, dict):
            items = []
            for k, x in v.items():
                if not isinstance(k, _KEYS):
                    raise FormatError("%s: a dict key of type %s; keys may be str, int, float, bool or None"
                                      % (path, type(k).__name__))
                items.append([k, walk(x, "%s[%r]" % (path, k))])
            return {"D": items}
        if isinstance(v, list):
            return {"L": [walk(x, "%s[%d]" % (path, i)) for i, x in enumerate(v)]}
        if isinstance(v, tuple):
            return {"U": [walk(x, "%s[%d]" % (path, i)) for i, x in enumerate(v)]}
        if v is None or isinstance(v, (bool, int, float, str)):
            return {"V": v}
        raise FormatError("%s: a value of type %s; a state holds %s" % (path, type(v).__module__ + "." + type(v).__qualname__,
                                                                      SUPPORTED))

    tree = walk(obj, "state")
    header = {"format": FORMAT, "version": VERSION, "tree": tree, "tensors": metas}
    header["nbytes"] = sum(_nbytes(m) for m in metas)
    return header, tensors


def map_tensors(obj, fn, other=lambda v: v):
    """map_tensors rebuilds a state's tree (dicts, lists, tuples) with fn
    applied to each tensor and other to every other leaf. A state_dict's
    module versions (`_metadata`, read by load_state_dict) are kept."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        out = type(obj)((k, map_tensors(v, fn, other)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            out._metadata = other(obj._metadata)
        return out
    if type(obj) in (list, tuple):
        return type(obj)(map_tensors(v, fn, other) for v in obj)
    return other(obj)


def unflatten(header, tensors):
    """unflatten builds the state back from flatten's header and the tensors."""

    def build(node):
        if "T" in node:
            return tensors[node["T"]]
        if "D" in node:
            return {k: build(x) for k, x in node["D"]}
        if "L" in node:
            return [build(x) for x in node["L"]]
        if "U" in node:
            return tuple(build(x) for x in node["U"])
        if "V" in node:
            return node["V"]
        raise FormatError("a node of the header's tree is none of T, D, L, U, V: %r" % (sorted(node),))

    return build(header["tree"])


def dumps(header):
    """dumps is the header's bytes (UTF-8 JSON)."""
    return json.dumps(header, separators=(",", ":")).encode()


#: How deep a state's tree may nest (a model's state_dict is 2 or 3 deep): a
#: forged header nested deeper is refused, not a RecursionError.
MAX_DEPTH = 64


def loads(data):
    """loads reads a header written by dumps and checks it whole: its
    format, every tensor's dtype and shape (non-negative dimensions), and a
    tree of at most MAX_DEPTH levels whose every node is one of T (a tensor
    of the list), D, L, U or V (a JSON scalar). A forged header is a
    FormatError, never another exception (a peer's state is refused, a
    checkpoint falls back to an older one)."""
    try:
        header = json.loads(bytes(data).decode())
    except (ValueError, RecursionError) as e:
        raise FormatError("the header is not JSON: %s" % e) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise FormatError("not an %s header" % FORMAT)
    if header.get("version") != VERSION:
        raise FormatError("%s version %r; this etjob reads version %d" % (FORMAT, header.get("version"), VERSION))
    metas = header.get("tensors")
    if not isinstance(metas, list):
        raise FormatError("the header's tensors are not a list")
    for i, m in enumerate(metas):
        if not isinstance(m, dict) or not isinstance(m.get("shape"), list) or \
                not all(type(d) is int and d >= 0 for d in m["shape"]) or len(m["shape"]) > MAX_DEPTH:
            raise FormatError("tensor %d: not a dtype and a shape of non-negative dimensions" % i)
        _dtype(m.get("dtype"))
    if type(header.get("nbytes")) is not int or header["nbytes"] != sum(_nbytes(m) for m in metas):
        raise FormatError("the header's nbytes is not its tensors' bytes")
    _check_tree(header.get("tree"), len(metas))
    return header


def _check_tree(root, ntensors):
    """_check_tree checks a header's tree without recursion (a forged one
    may nest as deep as its bytes allow)."""
    todo = [(root, 0)]
    while todo:
        node, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise FormatError("the state's tree nests deeper than %d" % MAX_DEPTH)
        if not isinstance(node, dict) or len(node) != 1:
            raise FormatError("a node of the header's tree is not one of T, D, L, U, V")
        (kind, v), = node.items()
        if kind == "T":
            if type(v) is not int or not 0 <= v < ntensors:
                raise FormatError("a tensor node names tensor %r of %d" % (v, ntensors))
        elif kind == "D":
            if not isinstance(v, list) or not all(isinstance(x, list) and len(x) == 2 and isinstance(x[0], _KEYS)
                                                  for x in v):
                raise FormatError("a dict node is not a list of [key, node] pairs")
            todo.extend((x[1], depth + 1) for x in v)
        elif kind in ("L", "U"):
            if not isinstance(v, list):
                raise FormatError("a list node is not a list")
            todo.extend((x, depth + 1) for x in v)
        elif kind == "V":
            if not (v is None or isinstance(v, (bool, int, float, str))):
                raise FormatError("a value node holds a %s" % type(v).__name__)
        else:
            raise FormatError("a node of the header's tree is none of T, D, L, U, V: %r" % (kind,))


def _dtype(name):
    dt = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dt, torch.dtype):
        raise FormatError("unknown dtype %r" % (name,))
    return dt


def _nbytes(meta):
    n = 1
    for d in meta["shape"]:
        n *= int(d)
    return n * torch.empty((), dtype=_dtype(meta["dtype"])).element_size()


def allocate(header):
    """allocate returns empty tensors of the header's dtypes and shapes."""
    return [torch.empty(m["shape"], dtype=_dtype(m["dtype"])) for m in header["tensors"]]


def byte_views(tensors):
    """byte_views are the tensors as flat uint8 views (no copies): the
    state's byte stream, in order."""
    return [t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8) for t in tensors]


def segments(views, start, end):
    """segments yields (view, begin, stop, at): the bytes [start, end) of
    the stream are view[begin:stop] for each piece, at offset `at` of the
    range."""
    pos = 0
    for v in views:
        n = v.numel()
        lo, hi = max(start, pos), min(end, pos + n)
        if lo < hi:
            yield v, lo - pos, hi - pos, lo - start
        pos += n
        if pos >= end:
            return


def pack(views, start, end, out):
    """pack copies the stream's bytes [start, end) into out[:end-start]."""
    for v, b, s, at in segments(views, start, end):
        out[at:at + s - b].copy_(v[b:s])
    return out[:end - start]


def unpack(views, start, end, chunk):
    """unpack copies chunk, the stream's bytes [start, end), into the views."""
    for v, b, s, at in segments(views, start, end):
        v[b:s].copy_(chunk[at:at + s - b])


#: A state file (an etjob checkpoint) starts with these bytes, then the
#: header's length (8 bytes, little-endian), the header, the tensors' bytes.
MAGIC = b"ETJOBST1"

#: The largest header a reader accepts (its JSON: the tree, every tensor's
#: dtype and shape).
MAX_HEADER = 64 << 20


def write(f, obj):
    """write writes obj to the binary file f in the format: no pickle, and
    no copy of the tensors (their bytes are written from where they are)."""
    header, tensors = flatten(obj)
    raw = dumps(header)
    f.write(MAGIC)
    f.write(len(raw).to_bytes(8, "little"))
    f.write(raw)
    for v in byte_views(tensors):
        if v.numel():
            f.write(memoryview(v.numpy()))


def read(f, size):
    """read reads a state written by write from the binary file f of size
    bytes. The header must say exactly the bytes that follow it, so a forged
    header cannot make the reader allocate more than the file holds."""
    if f.read(len(MAGIC)) != MAGIC:
        raise FormatError("not an %s file (no %r at its start)" % (FORMAT, MAGIC))
    n = int.from_bytes(f.read(8), "little")
    if not 0 < n <= min(MAX_HEADER, size - len(MAGIC) - 8):
        raise FormatError("a header of %d bytes in a file of %d" % (n, size))
    header = loads(f.read(n))
    body = size - len(MAGIC) - 8 - n
    if header.get("nbytes") != body or sum(_nbytes(m) for m in header["tensors"]) != body:
        raise FormatError("the header says %r bytes of tensors, the file holds %d (torn or not ours)" % (header.get("nbytes"), body))
    tensors = allocate(header)
    for v in byte_views(tensors):
        buf = memoryview(v.numpy())
        got = 0
        while got < len(buf):
            k = f.readinto(buf[got:])
            if not k:
                raise FormatError("the file ends %d bytes early" % (len(buf) - got))
            got += k
    return unflatten(header, tensors)
