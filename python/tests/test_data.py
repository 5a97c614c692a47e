"""etjob.data without processes: DistributedSampler's epochs (a shorter
last global batch, or none with drop_last), its state, each rank's share of
a step for any world, the epoch an iterator hands out (a joiner's loop
catching up, the tutorial's peek before set_epoch), and what DataLoader
refuses by name. The loader with real generations, worker processes and a
resize: test_elastic_shapes.DataLoaderTest."""

import unittest

try:
    import torch
    import torch.utils.data as tud

    from etjob import data, ddp
except ImportError:  # pragma: no cover
    torch = None


def sampler(n, global_batch, **kw):
    s = data.DistributedSampler(range(n), **kw)
    s.global_batch = global_batch
    return s


@unittest.skipIf(torch is None, "needs torch")
class SamplerTest(unittest.TestCase):
    def test_the_last_global_batch_is_the_rest(self):
        s = sampler(10, 4, seed=1)
        self.assertEqual(s.steps_per_epoch, 3)
        sizes = []
        while s.epoch == 0:
            sizes.append(len(s.global_batch_indices()))
            s.commit()
        self.assertEqual(sizes, [4, 4, 2])
        self.assertEqual((s.epoch, s.consumed), (1, 0))
        self.assertEqual(s.problems(), [])
        self.assertEqual(s.ledger, [[0, 0, 10]])

    def test_drop_last_drops_the_rest(self):
        s = sampler(10, 4, drop_last=True)
        self.assertEqual(s.steps_per_epoch, 2)
        for _ in range(2):
            s.commit()
        self.assertEqual((s.epoch, s.ledger), (1, [[0, 0, 8]]))
        self.assertEqual(s.problems(), [])

    def test_no_shuffle_is_the_dataset_order(self):
        s = sampler(6, 3, shuffle=False)
        self.assertEqual(s.global_batch_indices().tolist(), [0, 1, 2])

    def test_the_state_keeps_the_global_batch(self):
        s = sampler(20, 8, seed=2)
        s.commit()
        other = data.DistributedSampler(range(20), seed=2)
        other.load_state_dict(s.state_dict())
        self.assertEqual((other.global_batch, other.epoch, other.consumed, other.ledger), (8, 0, 8, [[0, 0, 8]]))

    def test_each_rank_takes_its_rows_for_any_world(self):
        s = sampler(10, 4, seed=1)
        shards = data._Shards(s)
        for world in (1, 2, 3, 4):
            got = []
            for rank in range(world):
                shards.start = (0, 0, rank, world)
                got.append(list(shards))
            for step in range(3):
                rows = sorted(i for r in range(world) for i in got[r][step])
                at = step * 4
                self.assertEqual(rows, sorted(s.order(0)[at:at + 4].tolist()), "world %d step %d" % (world, step))
        shards.start = (0, 4, 0, 2)  # from a committed position
        self.assertEqual(len(list(shards)), 2)

    def test_an_iterable_dataset_is_refused(self):
        class Stream(tud.IterableDataset):
            def __iter__(self):
                return iter(())

        with self.assertRaisesRegex(TypeError, "IterableDataset"):
            data.DistributedSampler(Stream())


@unittest.skipIf(torch is None, "needs torch")
class EpochTest(unittest.TestCase):
    """_Iterator._choose: the epoch an iterator hands out."""

    def test_a_joiners_loop_catches_up_by_its_epoch_numbers(self):
        s = sampler(8, 4)
        s.epoch, s.consumed = 2, 4  # the state a joiner took at its first sync
        self.assertEqual(data._Iterator._choose(s), 2)  # the peek, before set_epoch: the state's
        s.set_epoch(0)
        self.assertEqual(data._Iterator._choose(s), 0)  # the loop's epoch 0: stops at once (the caller)
        s.ended.add(0)
        self.assertEqual(data._Iterator._choose(s), 2)  # the next peek
        s.set_epoch(2)
        self.assertEqual(data._Iterator._choose(s), 2)

    def test_a_later_epoch_skips_ahead(self):
        s = sampler(8, 4)
        s.commit()
        s.set_epoch(3)
        self.assertEqual(data._Iterator._choose(s), 3)
        self.assertEqual((s.epoch, s.consumed), (3, 0))


@unittest.skipIf(torch is None, "needs torch")
class RandomStreamTest(unittest.TestCase):
    def test_starting_torchs_iterator_again_draws_nothing_from_the_process(self):
        # torch draws its workers' base seed from the loader's generator:
        # etjob's own, seeded by the position; the process's stream (the
        # next step's dropout) is left alone however often it starts again
        ds = torch.utils.data.TensorDataset(torch.arange(8.0))
        loader = data.DataLoader(ds, batch_size=2, sampler=data.DistributedSampler(ds, num_replicas=2))
        before = torch.get_rng_state()
        first = next(loader._start((0, 0, 0, 2)))
        again = next(loader._start((0, 0, 0, 2)))
        self.assertTrue(torch.equal(before, torch.get_rng_state()))
        self.assertTrue(torch.equal(first[0], again[0]))
        seeds = []
        for _ in range(2):
            loader._start((1, 4, 0, 2))
            seeds.append(loader._generator.initial_seed())
        self.assertEqual(seeds[0], seeds[1])


@unittest.skipIf(torch is None, "needs torch")
class RefusedTest(unittest.TestCase):
    def setUp(self):
        self.ds = torch.utils.data.TensorDataset(torch.zeros(8, 2))

    def test_a_batch_sampler(self):
        with self.assertRaisesRegex(TypeError, "batch_sampler is etjob's"):
            data.DataLoader(self.ds, batch_sampler=[[0, 1]])

    def test_torchs_sampler(self):
        with self.assertRaisesRegex(TypeError, "etjob.elastic.DistributedSampler, not SequentialSampler"):
            data.DataLoader(self.ds, batch_size=2, sampler=tud.SequentialSampler(self.ds))

    def test_shuffle_beside_a_sampler(self):
        with self.assertRaisesRegex(ValueError, "mutually exclusive with shuffle"):
            data.DataLoader(self.ds, batch_size=2, shuffle=True, sampler=data.DistributedSampler(self.ds))

    def test_the_global_batch_is_made_for_workers(self):
        import os

        os.environ["workers"] = "3"
        try:
            loader = data.DataLoader(self.ds, batch_size=2, sampler=data.DistributedSampler(self.ds))
        finally:
            del os.environ["workers"]
        self.assertEqual(loader.sampler.global_batch, 6)
        self.assertEqual(len(loader), 2)  # 6 and the rest, 2
        loader = data.DataLoader(self.ds, batch_size=2, sampler=data.DistributedSampler(self.ds, num_replicas=4))
        self.assertEqual(loader.sampler.global_batch, 8)

    def test_no_optimizer(self):
        loader = data.DataLoader(self.ds, batch_size=2, sampler=data.DistributedSampler(self.ds, num_replicas=1))
        live = ddp.live_optimizers
        ddp.live_optimizers = lambda: []
        try:
            with self.assertRaisesRegex(RuntimeError, r"no etjob.elastic.Optimizer: wrap the optimizer"):
                next(iter(loader))
        finally:
            ddp.live_optimizers = live


if __name__ == "__main__":
    unittest.main()
