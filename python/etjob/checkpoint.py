"""Take an etjob checkpoint elsewhere, and bring one in (needs PyTorch):

    python3 -m etjob.checkpoint export DIR_OR_FILE OUT [--to torch|dcp] [--object NAME]
    python3 -m etjob.checkpoint import FILE DIR --trusted [--step N]

etjob writes checkpoints in its own format (etjob.stateio: a JSON header and
the tensors' bytes, no pickle), which nothing else reads. `export` writes the
newest checkpoint of DIR (or the file named) in torch's formats:

* `--to torch` (the default): a torch.save file, for torch.load and
  model.load_state_dict. The whole state is {"objects": {name: its
  state_dict}, "values": {...}, "step", "commits"}; `--object model` writes
  that one state_dict alone (what `model.load_state_dict(torch.load(OUT))`
  takes).
* `--to dcp` (torch 2.x): a directory of torch's distributed checkpoint
  (torch.distributed.checkpoint.save), for dcp.load and every tool that
  reads it.

`import` writes a torch.save file into DIR as an etjob checkpoint at step N
(the file's own step, else 0), which `load_checkpoint(DIR)` then resumes
from. A torch.save file is a pickle: loading it runs whatever code its
writer put in it, so `import` takes only a file you trust and says so with
`--trusted` (etjob itself never unpickles a checkpoint: the shared volume is
written by every worker of the job). A file that `export --to torch` wrote
comes back as it was; another dict is taken as a state: its entries with a
state_dict's shape (a dict of tensors and values) become objects of those
names, the rest values (a `step` among them names the step; without one,
`step` is set to N). The State that loads it must hold objects of the same
names.
"""

import argparse
import os
import sys

from etjob import torch as etorch


def _newest(src):
    """_newest reads the checkpoint src names: a file, or the newest of a
    directory."""
    if os.path.isdir(src):
        got = etorch.load_checkpoint(src)
        if got is None:
            raise SystemExit("etjob.checkpoint: no etjob checkpoint in %s" % src)
        return got
    return etorch.read_checkpoint(src)


def export(src, out, to="torch", obj=None):
    """export writes the checkpoint src (a file, or a directory's newest) to
    out in torch's format `to` (torch: a torch.save file; dcp: a directory of
    torch.distributed.checkpoint). obj: one object's state_dict alone."""
    import torch

    state = _newest(src)
    if obj is not None:
        objects = state.get("objects", {})
        if obj not in objects:
            raise SystemExit("etjob.checkpoint: --object %s: the checkpoint holds %s" % (
                obj, ", ".join(sorted(objects)) or "no objects"))
        data = objects[obj]
    else:
        data = {k: state[k] for k in ("objects", "values", "step", "commits") if k in state}
    if to == "torch":
        tmp = out + ".tmp"
        torch.save(data, tmp)
        os.replace(tmp, out)
    elif to == "dcp":
        try:
            import torch.distributed.checkpoint as dcp
        except ImportError:
            raise SystemExit("etjob.checkpoint: --to dcp needs torch's distributed checkpoint (torch 2.x); this is "
                             "torch %s" % torch.__version__) from None
        if not hasattr(dcp, "save"):
            raise SystemExit("etjob.checkpoint: --to dcp needs torch.distributed.checkpoint.save (torch 2.2 or "
                             "newer); this is torch %s" % torch.__version__)
        kw = {"no_dist": True} if _takes(dcp.save, "no_dist") else {}  # one process, no group
        dcp.save(data, checkpoint_id=out, **kw)
    else:
        raise SystemExit("etjob.checkpoint: --to %s: torch or dcp" % to)
    return out


def _takes(fn, name):
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _is_state_dict(v):
    import torch

    return isinstance(v, dict) and bool(v) and all(isinstance(k, str) for k in v) and \
        any(isinstance(x, (torch.Tensor, dict)) for x in v.values())


def import_(path, directory, trusted, step=None):
    """import_ writes the torch.save file path (trusted: loading it runs its
    code) into directory as an etjob checkpoint and returns its path."""
    import torch

    if not trusted:
        raise SystemExit("etjob.checkpoint: %s is a torch.save file, a pickle: loading it runs whatever its writer "
                         "put in it. Import only a file you trust, and say so with --trusted" % path)
    try:
        got = torch.load(path, map_location="cpu", weights_only=False)
    except TypeError:  # torch 1.13: no weights_only
        got = torch.load(path, map_location="cpu")
    if not isinstance(got, dict):
        raise SystemExit("etjob.checkpoint: %s holds a %s, not a dict of state" % (path, type(got).__name__))
    if "objects" in got and "values" in got:
        state = dict(got)
    else:
        objects = {k: v for k, v in got.items() if _is_state_dict(v)}
        state = {"objects": objects, "values": {k: v for k, v in got.items() if k not in objects}}
    values = state["values"]
    if step is None:
        step = int(state.get("step", values.get("step", 0)))
    state["step"] = step
    values.setdefault("step", step)
    state.setdefault("commits", step)
    state["generation"] = 0
    return etorch.save_checkpoint(directory, state)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m etjob.checkpoint", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="an etjob checkpoint to torch's formats")
    e.add_argument("src", help="a checkpoint directory (its newest) or file")
    e.add_argument("out", help="the file (--to torch) or directory (--to dcp) to write")
    e.add_argument("--to", default="torch", choices=["torch", "dcp"])
    e.add_argument("--object", help="one object's state_dict alone (e.g. model)")
    i = sub.add_parser("import", help="a trusted torch.save file into an etjob checkpoint directory")
    i.add_argument("file")
    i.add_argument("dir")
    i.add_argument("--trusted", action="store_true", help="the file is yours: loading a pickle runs its code")
    i.add_argument("--step", type=int, help="the step to resume at (default: the file's own, else 0)")
    a = p.parse_args(argv)
    try:
        if a.cmd == "export":
            print(export(a.src, a.out, a.to, a.object))
        else:
            print(import_(a.file, a.dir, a.trusted, a.step))
    except etorch.CheckpointError as err:
        sys.exit("etjob.checkpoint: %s" % err)


if __name__ == "__main__":
    main()
