"""Sharded checkpoints: every rank writes its part, rank 0 the manifest.

A checkpoint of an etjob.elastic job is written by every rank of the
generation, not by rank 0 alone: each rank writes the tensors it owns of
the same commit (part-<step>-<r>of<W>.etjob, etjob.stateio's format, no
pickle), and once every part landed (the next vote says so) rank 0 writes
the manifest ckpt-<step>.etjob, then `latest`. Training waits only for the
copy of a rank's own part (the DDP API's state is live), a third of the
state at three ranks, and the bytes leave by three writers.

The manifest is a state file too: {"sharded": {"world": W, "parts": [file
names], "owner": [the rank that owns each tensor]}, "header": the state's
etjob.stateio header}. read() assembles the state from it and its parts,
checking every part's tensors against the header (dtype, shape, count): a
part that is missing, torn or forged fails the read, and load_checkpoint
falls back to an older checkpoint. Tensors are given to ranks greedily by
size (the largest first, to the rank with the fewest bytes so far), the
same on every rank for the same layout.
"""

import os

from etjob import stateio


def owners(header, world):
    """owners returns the rank that writes each tensor of header."""
    sizes = [stateio._nbytes(m) for m in header["tensors"]]
    load = [0] * world
    out = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        out[i] = r
        load[r] += sizes[i]
    return out


def part_name(step, rank, world):
    return "part-%08d-%dof%d.etjob" % (step, rank, world)


def part_step(name):
    """The step of a part file's name, or None for another file."""
    if not (name.startswith("part-") and name.endswith(".etjob")):
        return None
    try:
        return int(name[len("part-"):].split("-")[0])
    except ValueError:
        return None


def part_of(tensors, owner, rank):
    """The tensors of the state that rank writes, in order."""
    return [t for t, r in zip(tensors, owner) if r == rank]


def manifest(header, step, world, owner):
    """The manifest's state (written by rank 0 once every part landed)."""
    return {"sharded": {"world": world, "owner": owner, "parts": [part_name(step, r, world) for r in range(world)]},
            "header": header, "step": step}


def is_manifest(state):
    return isinstance(state, dict) and isinstance(state.get("sharded"), dict) and "header" in state


def read(directory, state, read_file):
    """read assembles the state a manifest names from its parts in
    directory; read_file(path) reads one state file. Raises
    stateio.FormatError when a part is missing, or does not hold what the
    header says it does."""
    meta = state["sharded"]
    try:
        header = stateio.loads(stateio.dumps(state["header"]))  # checked whole, as a peer's would be
        world, owner, parts = int(meta["world"]), list(meta["owner"]), list(meta["parts"])
    except (KeyError, TypeError, ValueError) as e:
        raise stateio.FormatError("a sharded checkpoint's manifest: %s" % e) from None
    metas = header["tensors"]
    if world < 1 or len(parts) != world or len(owner) != len(metas) or any(
            not isinstance(r, int) or not 0 <= r < world for r in owner):
        raise stateio.FormatError("a sharded checkpoint's manifest does not add up (world %r, %d parts, %d owners for "
                                  "%d tensors)" % (world, len(parts), len(owner), len(metas)))
    tensors = [None] * len(metas)
    for r, name in enumerate(parts):
        if not isinstance(name, str) or os.path.basename(name) != name or part_step(name) is None:
            raise stateio.FormatError("part %d is named %r, not a part file of the directory" % (r, name))
        got = read_file(os.path.join(directory, name))
        mine = [i for i, o in enumerate(owner) if o == r]
        have = got.get("tensors") if isinstance(got, dict) else None
        if not isinstance(have, list) or len(have) != len(mine):
            raise stateio.FormatError("%s holds %s tensors, the manifest says %d" % (
                name, len(have) if isinstance(have, list) else "no", len(mine)))
        for i, t in zip(mine, have):
            want = metas[i]
            if str(t.dtype).replace("torch.", "") != want["dtype"] or list(t.shape) != list(want["shape"]):
                raise stateio.FormatError("%s: tensor %d is %s %s, the header says %s %s" % (
                    name, i, t.dtype, list(t.shape), want["dtype"], want["shape"]))
            tensors[i] = t
    return stateio.unflatten(header, tensors)
