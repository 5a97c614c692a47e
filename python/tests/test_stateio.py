"""etjob.stateio: a state as a JSON header and its tensors' bytes, no pickle."""

import math
import unittest

try:
    import torch
    from etjob import stateio
except ImportError:  # pragma: no cover
    torch = None


@unittest.skipIf(torch is None, "needs torch")
class StateIOTest(unittest.TestCase):
    def roundtrip(self, obj, chunk=7):
        header, tensors = stateio.flatten(obj)
        header = stateio.loads(stateio.dumps(header))
        views = stateio.byte_views(tensors)
        got = stateio.allocate(header)
        into = stateio.byte_views(got)
        buf = torch.empty(chunk, dtype=torch.uint8)
        for start in range(0, header["nbytes"], chunk):
            end = min(start + chunk, header["nbytes"])
            stateio.unpack(into, start, end, stateio.pack(views, start, end, buf))
        return stateio.unflatten(header, got)

    def test_a_model_and_an_optimizer_come_back_equal(self):
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
        opt = torch.optim.AdamW(model.parameters())
        model(torch.randn(5, 3)).sum().backward()
        opt.step()
        state = {"objects": {"model": model.state_dict(), "opt": opt.state_dict()},
                 "values": {"step": 7, "lr": 0.5, "inf": math.inf, "name": "x", "none": None, "pair": (1, [2, 3])}}
        got = self.roundtrip(state)
        self.assertEqual(got["values"], state["values"])
        for k, v in state["objects"]["model"].items():
            self.assertTrue(torch.equal(got["objects"]["model"][k], v), k)
            self.assertEqual(got["objects"]["model"][k].dtype, v.dtype)
        # the optimizer's int keys stay ints: load_state_dict accepts it
        self.assertEqual(sorted(got["objects"]["opt"]["state"]), sorted(state["objects"]["opt"]["state"]))
        opt.load_state_dict(got["objects"]["opt"])

    def test_values_of_other_types_are_refused_with_their_path(self):
        with self.assertRaisesRegex(stateio.FormatError, r"state\['values'\]\['when'\]: a value of type builtins.object"):
            stateio.flatten({"values": {"when": object()}})
        with self.assertRaisesRegex(stateio.FormatError, "dict key of type tuple"):
            stateio.flatten({(1, 2): 3})

    def test_headers_that_are_not_ours_are_refused(self):
        for data in (b"\x80\x04pickle", b"[]", b'{"format":"etjob-state","version":99}',
                     b'{"format":"etjob-state","version":1,"tensors":[{"dtype":"os","shape":[1]}]}'):
            with self.assertRaises(stateio.FormatError, msg=data):
                stateio.loads(data)

    def test_forged_headers_are_format_errors(self):
        # issue #42 (low): each of these escaped as another exception
        # (RecursionError, KeyError, a negative dimension's RuntimeError):
        # a forged newest checkpoint crashed every resume instead of falling
        # back, a forged peer's header crashed the rank
        def header(tree, tensors=(), nbytes=None):
            h = {"format": "etjob-state", "version": 1, "tree": tree, "tensors": list(tensors)}
            h["nbytes"] = nbytes if nbytes is not None else 0
            return stateio.dumps(h)

        deep_tree = b'{"L":[' * 100 + b'{"V":1}' + b']}' * 100  # deeper than MAX_DEPTH, not than JSON's limit
        forged = {
            "deep json": b'{"a":' * 100000 + b"1" + b"}" * 100000,
            "deep tree": b'{"format":"etjob-state","version":1,"tensors":[],"nbytes":0,"tree":' + deep_tree + b"}",
            "negative dimensions": header({"T": 0}, [{"dtype": "float32", "shape": [-2, -3]}], 24),
            "no tensors list": stateio.dumps({"format": "etjob-state", "version": 1, "tree": {"V": 1}, "nbytes": 0}),
            "a tensor out of range": header({"T": 3}, [{"dtype": "float32", "shape": [1]}], 4),
            "a node of two kinds": header({"V": 1, "L": []}),
            "a value that is a list": header({"V": [1, 2]}),
            "a dict of bad pairs": header({"D": [["k"]]}),
            "nbytes that are not the tensors'": header({"T": 0}, [{"dtype": "float32", "shape": [2]}], 4),
            "a dtype that is not one": header({"T": 0}, [{"dtype": "__class__", "shape": [1]}], 4),
        }
        for name, data in forged.items():
            with self.assertRaises(stateio.FormatError, msg=name):
                stateio.loads(data)

    def test_a_forged_newest_checkpoint_falls_back(self):
        import os
        import tempfile

        from etjob import torch as etorch

        d = tempfile.mkdtemp(prefix="etjob-forged-")
        etorch.save_checkpoint(d, {"step": 10, "w": torch.ones(2)})
        h = stateio.dumps({"format": "etjob-state", "version": 1, "tree": {"T": 0},
                           "tensors": [{"dtype": "float32", "shape": [-2, -3]}], "nbytes": 24})
        with open(os.path.join(d, "ckpt-00000020.etjob"), "wb") as f:
            f.write(stateio.MAGIC + len(h).to_bytes(8, "little") + h + b"\0" * 24)
        with open(os.path.join(d, "latest"), "w") as f:
            f.write('{"file": "ckpt-00000020.etjob", "step": 20}')
        self.assertEqual(etorch.load_checkpoint(d)["step"], 10)
        # a `latest` that names a path out of the directory is not followed
        outside = tempfile.mkdtemp(prefix="etjob-outside-")
        etorch.save_checkpoint(outside, {"step": 99, "w": torch.zeros(2)})
        with open(os.path.join(d, "latest"), "w") as f:
            f.write('{"file": "../%s/ckpt-00000099.etjob", "step": 99}' % os.path.basename(outside))
        self.assertEqual(etorch.load_checkpoint(d)["step"], 10)

    def test_empty_tensors_and_chunks_across_tensors(self):
        state = [torch.arange(10, dtype=torch.int16), torch.empty(0), torch.ones(3, 2, dtype=torch.float64)]
        got = self.roundtrip(state, chunk=5)
        for a, b in zip(state, got):
            self.assertTrue(torch.equal(a, b))


if __name__ == "__main__":
    unittest.main()
