"""python3 forced_torchrun.py TORCHRUN_ARGS...: etjob.torchrun whose node is
lost the moment its first rendezvous round completes, before its agent shares
its ranks: the race of a burst in which a second node goes just after the
round the first one's loss started (test_torchrun.RoundLostTest). The loss is
forced here, in the test, by wrapping torch's next_rendezvous after
etjob.torchrun patched it; nothing in etjob.torchrun knows about it."""

import os
import sys

from etjob import torchrun


def main():
    patch = torchrun._patch_rendezvous

    def patch_then_die_after_a_round(poll):
        patch(poll)
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

        joined = dr.DynamicRendezvousHandler.next_rendezvous

        def next_rendezvous(self):
            joined(self)
            print("forced: lost after round %d" % self._state_holder.state.round, file=sys.stderr, flush=True)
            os._exit(9)

        dr.DynamicRendezvousHandler.next_rendezvous = next_rendezvous

    torchrun._patch_rendezvous = patch_then_die_after_a_round
    torchrun.main(sys.argv[1:])


if __name__ == "__main__":
    main()
