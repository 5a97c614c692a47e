"""The store a generation's gloo group is set up over: every rank's address
in O(1) store calls a rank, not O(N).

gloo's setup has each rank set one key of a family ("0/<rank>": its
addresses; torch 1.13 also "0/rank_<rank>": its host name) and then wait for
and read every other rank's key of that family: N calls a rank, N^2 for the
group (measured with a logging store on torch 1.13 and 2.15; on 1.13 rank r
reads the host names of ranks 0..r-1 only, so rank 0 reads none). BulkStore
serves those reads from one bulk read: the first rank that needs a family
claims it (one add), waits for the whole family in one call, reads it (one
multi_get where the store has it, else one get a key) and publishes it as
one value; every other rank that needs it claims too, then waits for and
reads that value (three calls). Any other key passes through. Every rank
sets its own key of a family before it reads another's, so the claimant's
wait ends; a rank that never sets its key makes the claimant's wait time
out, and with it every rank's, as gloo's own wait for that key would.
"""

import struct

import torch.distributed as dist

_BLOB = "etjob-bulk/"


def family(key, rank):
    """family is the part of key before this rank's number when key is
    <family><rank> (a key of one a rank family), else None."""
    tail = str(rank)
    if not key.endswith(tail):
        return None
    head = key[:-len(tail)]
    if head and head[-1].isdigit():
        return None
    return head


def pack(values):
    return b"".join(struct.pack(">I", len(v)) + v for v in values)


def unpack(blob, n):
    out, at = [], 0
    for _ in range(n):
        (size,) = struct.unpack_from(">I", blob, at)
        at += 4
        out.append(bytes(blob[at:at + size]))
        at += size
    if len(out) != n or at != len(blob):
        raise RuntimeError("etjob.groupstore: a bulk value of %d bytes does not hold %d ranks' keys" % (len(blob), n))
    return out


def _bytes(v):
    return v.encode() if isinstance(v, str) else bytes(v)


class BulkStore(dist.Store):
    """BulkStore is the store of rank `rank` of a group of `size` over
    inner (a PrefixStore of the group's own), for the group's setup
    (module docstring). timeout (a timedelta) bounds its waits."""

    def __init__(self, inner, rank, size, timeout):
        super().__init__()
        self._inner, self._rank, self._size, self._timeout = inner, rank, size, timeout
        self._own = {}   # key -> value this rank set, of a rank family
        self._got = {}   # family -> every rank's value

    def _lookup(self, key):
        """The value of key from this rank's own keys and the families it
        read in bulk (reading the family once), or None: not of a family."""
        if key in self._own:
            return self._own[key]
        for fam in list(self._got):
            tail = key[len(fam):] if key.startswith(fam) else ""
            if tail.isdigit() and (tail == "0" or tail[0] != "0") and int(tail) < self._size:
                return self._fetch(fam)[int(tail)]
        return None

    def _fetch(self, fam):
        got = self._got.get(fam)
        if got is not None:
            return got
        inner, blob = self._inner, _BLOB + fam
        if int(inner.add(_BLOB + "claim/" + fam, 1)) == 1:
            keys = [fam + str(i) for i in range(self._size)]
            inner.wait(keys, self._timeout)
            multi = getattr(inner, "multi_get", None)
            values = None
            if multi is not None:
                try:
                    values = [bytes(v) for v in multi(keys)]
                except (RuntimeError, NotImplementedError):
                    values = None
            if values is None:
                values = [bytes(inner.get(k)) for k in keys]
            inner.set(blob, pack(values))
        else:
            inner.wait([blob], self._timeout)
            values = unpack(inner.get(blob), self._size)
        self._got[fam] = values
        return values

    # -- c10d's Store -------------------------------------------------------

    def set(self, key, value):
        self._inner.set(key, value)
        fam = family(key, self._rank)
        if fam is not None:
            self._own[key] = _bytes(value)
            self._got.setdefault(fam, None)

    def get(self, key):
        v = self._lookup(key)
        return v if v is not None else self._inner.get(key)

    def wait(self, keys, timeout=None):
        rest = [k for k in keys if self._lookup(k) is None]
        if rest:
            self._inner.wait(rest, timeout if timeout is not None else self._timeout)

    def check(self, keys):
        rest = [k for k in keys if self._lookup(k) is None]
        return self._inner.check(rest) if rest else True

    def add(self, key, value):
        return self._inner.add(key, value)

    def compare_set(self, key, expected, desired):
        return self._inner.compare_set(key, expected, desired)

    def delete_key(self, key):
        return self._inner.delete_key(key)

    def num_keys(self):
        return self._inner.num_keys()

    def set_timeout(self, timeout):
        self._timeout = timeout
