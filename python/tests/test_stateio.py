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

    def test_empty_tensors_and_chunks_across_tensors(self):
        state = [torch.arange(10, dtype=torch.int16), torch.empty(0), torch.ones(3, 2, dtype=torch.float64)]
        got = self.roundtrip(state, chunk=5)
        for a, b in zip(state, got):
            self.assertTrue(torch.equal(a, b))


if __name__ == "__main__":
    unittest.main()
